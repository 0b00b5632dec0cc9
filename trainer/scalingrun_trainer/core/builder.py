"""spec.model.builder: the user's own network, "package.module:function", checked before any training step.

The contract: function(input_shape, num_classes, **params) returns an uncompiled tf.keras.Model (Keras) or a
torch.nn.Module (Lightning) that takes float32 images in [0, 1] (NHWC for Keras, NCHW for torch) and returns
logits of shape (batch, num_classes). A `Builder` imports it and binds the arguments; each engine's
`build_network` (frameworks/keras/models.py, frameworks/lightning/network.py) builds it and runs a batch of PROBE_BATCH zero images
through it. Any failure is a BuilderError naming the builder, the image and the Python error, so that the run
fails with that message before training and nothing reaches modelUri.
"""

from __future__ import annotations

import importlib
import inspect
import json
from typing import Any, Callable, Optional

from scalingrun_api.models import Model

PROBE_BATCH = 2


class BuilderError(RuntimeError):
    """The builder cannot be used; the message names it, the image and the Python error."""


class Builder:
    def __init__(self, path: str, params: Optional[dict[str, Any]] = None, image: Optional[str] = None):
        self.path, self.params, self.image = path, dict(params or {}), image or "this environment"

    @classmethod
    def of(cls, model: Model, image: Optional[str]) -> "Builder":
        return cls(model.builder, model.params, image)

    def error(self, what: str, exc: Optional[BaseException] = None) -> BuilderError:
        cause = f": {type(exc).__name__}: {exc}".splitlines()[0] if exc is not None else ""
        return BuilderError(f"spec.model.builder {self.path!r} in image {self.image}: {what}{cause}")

    def load(self) -> Callable[..., Any]:
        module_name, _, function_name = self.path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any import-time error is the user's to see
            raise self.error(f"cannot import {module_name} (is the package in the image, or on PYTHONPATH / "
                             "--python-path locally?)", exc) from exc
        function = getattr(module, function_name, None)
        if not callable(function):
            found = "nothing" if function is None else type(function).__name__
            raise self.error(f"module {module_name} has no function {function_name} (found {found})")
        return function

    def build(self, image_size: int, num_classes: int) -> Any:
        """The function's return value for input_shape (S, S, 3), after its signature took the arguments."""
        function = self.load()
        input_shape = (image_size, image_size, 3)
        try:
            inspect.signature(function).bind(input_shape, num_classes, **self.params)
        except TypeError as exc:
            raise self.error("wrong signature, expected function(input_shape, num_classes, **params) with "
                             f"params {sorted(self.params)}", exc) from exc
        except ValueError:
            pass  # no signature to inspect (a builtin): the call says it
        try:
            return function(input_shape, num_classes, **self.params)
        except Exception as exc:  # noqa: BLE001
            raise self.error(f"calling it with input_shape={input_shape}, num_classes={num_classes} failed",
                             exc) from exc

    def run_probe(self, network: Any, batch: Any, layout: str, image_size: int) -> tuple:
        """The shape of the network's output for a batch of zero images (`layout` names their order)."""
        shape = (image_size, image_size, 3) if layout == "NHWC" else (3, image_size, image_size)
        try:
            output = network(batch)
        except Exception as exc:  # noqa: BLE001
            raise self.error(f"the network failed on a batch of {PROBE_BATCH} float32 images of shape {shape} "
                             f"({layout})", exc) from exc
        return tuple(getattr(output, "shape", ()))

    def check_output(self, shape: tuple, num_classes: int, layout: str) -> None:
        wanted = (PROBE_BATCH, num_classes)
        if tuple(shape) != wanted:
            raise self.error(f"the network returned shape {tuple(shape)} for a batch of {PROBE_BATCH} {layout} "
                             f"images; it must return logits of shape (batch, num_classes) = {wanted}")


def network_name(model: Model) -> str:
    """What a checkpoint was trained with: the base, or the builder and its params."""
    if model.builder:
        return f"{model.builder}({json.dumps(model.params or {}, sort_keys=True)})"
    return model.base
