"""spec.model: a built-in transfer-learning network (base + head), or the user's own network (builder).

The built-in fields (base, weights, trainableBase, dropout) have no default in the CRD: a spec that names only a
builder must not look as if it named a base too. Their defaults are filled by `resolve_builtin_defaults` when
neither model.builder nor training.command is set (ScalingRunSpec calls it), so `scalingrun validate`, the
operator and admission see the same spec.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import Field, WithJsonSchema

from .common import WEIGHTS_PATTERN, ApiModel

# "package.module:function": a module path (dotted identifiers), a colon, a function name.
BUILDER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class BaseNetwork(str, Enum):
    efficientnet_lite0 = "efficientnet_lite0"
    mobilenet_v2 = "mobilenet_v2"
    xception = "xception"


# The built-in network's fields and their defaults: (field name, camelCase path part, default).
BUILTIN_DEFAULTS = (
    ("base", "base", BaseNetwork.efficientnet_lite0.value),
    ("weights", "weights", "imagenet"),
    ("trainable_base", "trainableBase", False),
    ("dropout", "dropout", 0.2),
)

# A free-form object (any JSON keys and values): the API server keeps it as it is.
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class Model(ApiModel):
    """The network: a pretrained base with a softmax head (the default), or your own (builder)."""

    base: Optional[BaseNetwork] = Field(
        None, description="Pretrained base network (include_top=False). Default efficientnet_lite0 unless "
        "model.builder or training.command is set (they exclude it).")
    weights: Optional[str] = Field(
        None, description="Weights of the base: imagenet, none (random init), or a weights file: s3://bucket/key (the "
        "run's storage), file:///path or /path (in the trainer image or a mounted volume). Default imagenet with a "
        "base.", pattern=WEIGHTS_PATTERN)
    trainable_base: Optional[bool] = Field(
        None, description="Fine-tune the base too; by default (false) it is frozen and only the head trains.")
    dropout: Optional[float] = Field(
        None, ge=0, lt=1, description="Dropout before the softmax head of a base. Default 0.2 with a base.")
    num_classes: Optional[int] = Field(
        None, ge=2, le=100000, description="Number of classes; inferred from the dataset when omitted.")
    builder: Optional[str] = Field(
        None, pattern=BUILDER_PATTERN, max_length=253,
        description="Your own network instead of a base: \"package.module:function\", imported in the trainer "
        "image (yours, built FROM the trainer image). Called as function(input_shape, num_classes, **params); "
        "returns an uncompiled tf.keras.Model (framework keras) or a torch.nn.Module (pytorch-lightning) that "
        "takes float32 images in [0, 1] (NHWC for Keras, NCHW for torch) and returns logits (batch, "
        "num_classes). The trainer compiles, scales the learning rate, stops early, checkpoints and resumes. "
        "Excludes base, weights, trainableBase and dropout.")
    params: Optional[FreeForm] = Field(
        None, description="Keyword arguments of model.builder (any JSON object); with training.command, read by "
        "your script from the SDK's context (ctx.spec).")

    def builtin_fields_set(self) -> list[str]:
        """The camelCase names of the built-in network's fields that have a value."""
        return [alias for name, alias, _ in BUILTIN_DEFAULTS if getattr(self, name) is not None]


def resolve_builtin_defaults(model: Model, command: Optional[list[str]]) -> None:
    """The built-in network's defaults, for a spec that uses it (neither model.builder nor training.command)."""
    if model.builder or command:
        return
    for name, _, default in BUILTIN_DEFAULTS:
        if getattr(model, name) is None:
            setattr(model, name, default)
