"""Transfer learning: a pretrained base (include_top=False, average pooling), dropout, a softmax head."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

from .storage import open_location


class ModelError(RuntimeError):
    """The model cannot be built as configured; the message says why."""


def local_weights(weights: str, endpoint: Optional[str] = None, region: Optional[str] = None) -> Optional[str]:
    """None, 'imagenet', or a local path for a weights URI (s3:// files are downloaded)."""
    if weights == "none":
        return None
    if weights == "imagenet":
        return "imagenet"
    location = open_location(weights, endpoint, region)
    if weights.startswith("s3://"):
        try:
            data = location.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read weights file {weights}: {exc}") from None
        suffix = os.path.splitext(weights)[1]
        handle, path = tempfile.mkstemp(suffix=suffix, prefix="weights-")
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        return path
    if not os.path.isfile(location.path):
        raise ModelError(f"weights file {weights} does not exist")
    return location.path


def build_base(name: str, image_size: int, weights: Optional[str]):
    """(base model with a pooled feature output, preprocess function for float pixels in [0, 255])."""
    import tensorflow as tf

    shape = (image_size, image_size, 3)
    try:
        if name == "efficientnet_lite0":
            from .efficientnet_lite import EfficientNetLite0, preprocess_input

            return EfficientNetLite0(input_shape=shape, include_top=False, pooling="avg", weights=weights), preprocess_input
        if name == "mobilenet_v2":
            app = tf.keras.applications.mobilenet_v2
            return app.MobileNetV2(input_shape=shape, include_top=False, pooling="avg", weights=weights), app.preprocess_input
        if name == "xception":
            app = tf.keras.applications.xception
            return app.Xception(input_shape=shape, include_top=False, pooling="avg", weights=weights), app.preprocess_input
    except ModelError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load {name} weights {weights!r}: {str(exc).splitlines()[0]}") from None
    raise ModelError(f"unknown base network {name!r}")


def build_model(base_name: str, image_size: int, num_classes: int, weights: Optional[str], dropout: float,
                trainable_base: bool) -> tuple["object", Callable]:
    """The whole classifier and the preprocess function its input pipeline must apply."""
    import tensorflow as tf

    base, preprocess = build_base(base_name, image_size, weights)
    base.trainable = trainable_base
    inputs = tf.keras.Input((image_size, image_size, 3), name="image")
    # training=False keeps a frozen base's BatchNorm in inference mode (the Keras transfer-learning rule).
    features = base(inputs, training=False if not trainable_base else None)
    if dropout:
        features = tf.keras.layers.Dropout(dropout, name="head_dropout")(features)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", name="head")(features)
    return tf.keras.Model(inputs, outputs, name=f"{base_name}_transfer"), preprocess
