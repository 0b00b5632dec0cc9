"""The classifiers Keras trains: transfer learning (uint8 pixels, the base's normalisation, a pretrained base
(include_top=False, average pooling), dropout, a softmax head), or the user's own network (model.builder) between
uint8 pixels in and a softmax out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...core.builder import PROBE_BATCH, Builder
from ...core.weights import ModelError

# Each base's own preprocess_input as (scale, offset) on [0, 255] pixels: x * scale + offset.
INPUT_SCALING = {
    "efficientnet_lite0": (1 / 128.0, -127.0 / 128.0),  # (x - 127) / 128, see core/efficientnet_lite.py
    "mobilenet_v2": (1 / 127.5, -1.0),  # keras.applications.mobilenet_v2.preprocess_input: x / 127.5 - 1
    "xception": (1 / 127.5, -1.0),  # keras.applications.xception.preprocess_input ("tf" mode)
}


def build_base(name: str, image_size: int, weights: Optional[str]):
    """The base model with a pooled feature output, for float pixels already normalised for it."""
    import tensorflow as tf

    shape = (image_size, image_size, 3)
    try:
        if name == "efficientnet_lite0":
            from .efficientnet_lite import EfficientNetLite0

            return EfficientNetLite0(input_shape=shape, include_top=False, pooling="avg", weights=weights)
        if name == "mobilenet_v2":
            return tf.keras.applications.MobileNetV2(input_shape=shape, include_top=False, pooling="avg", weights=weights)
        if name == "xception":
            return tf.keras.applications.Xception(input_shape=shape, include_top=False, pooling="avg", weights=weights)
    except ModelError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load {name} weights {weights!r}: {str(exc).splitlines()[0]}") from None
    raise ModelError(f"unknown base network {name!r}")


def input_normalization(name: str):
    """The base's preprocess_input as a standard Keras layer: uint8 pixels in, the base's float range out."""
    import tensorflow as tf

    if name not in INPUT_SCALING:
        raise ModelError(f"unknown base network {name!r}")
    scale, offset = INPUT_SCALING[name]
    return tf.keras.layers.Rescaling(scale, offset, name="preprocess_input")


@dataclass(frozen=True)
class TransferNetwork:
    """The classifier and its two halves, sharing their layers (training one trains the other)."""

    model: Any  # uint8 pixels -> class probabilities: what is saved (and trained without the feature cache)
    features: Any  # uint8 pixels -> the base's pooled features (normalisation and base, inference mode when frozen)
    head: Any  # pooled features -> class probabilities: the model's own dropout and softmax layers


def build_network(base_name: str, image_size: int, num_classes: int, weights: Optional[str], dropout: float,
                  trainable_base: bool) -> TransferNetwork:
    """The whole classifier, taking uint8 RGB pixels as the Parquet stores them.

    The base's preprocess_input is the model's first layer, not a step of the input pipeline: on a GPU
    worker the conversion runs on the GPU and a quarter of the bytes cross to it, the CPU input pipeline
    delivers about 1.5x the images (bench/input_pipeline.py), and the saved model serves raw pixels.
    """
    import tensorflow as tf

    base = build_base(base_name, image_size, weights)
    base.trainable = trainable_base
    inputs = tf.keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    pixels = input_normalization(base_name)(inputs)
    # training=False keeps a frozen base's BatchNorm in inference mode (the Keras transfer-learning rule).
    features = base(pixels, training=False if not trainable_base else None)
    head_layers = [tf.keras.layers.Dropout(dropout, name="head_dropout")] if dropout else []
    head_layers.append(tf.keras.layers.Dense(num_classes, activation="softmax", name="head"))

    def head(x):
        for layer in head_layers:
            x = layer(x)
        return x

    pooled = tf.keras.Input(features.shape[1:], name="features")
    return TransferNetwork(model=tf.keras.Model(inputs, head(features), name=f"{base_name}_transfer"),
                           features=tf.keras.Model(inputs, features, name=f"{base_name}_features"),
                           head=tf.keras.Model(pooled, head(pooled), name=f"{base_name}_head"))


def build_model(base_name: str, image_size: int, num_classes: int, weights: Optional[str], dropout: float,
                trainable_base: bool):
    """The whole classifier (see build_network)."""
    return build_network(base_name, image_size, num_classes, weights, dropout, trainable_base).model


def build_user_network(builder: Builder, image_size: int, num_classes: int):
    """The user's tf.keras.Model, checked on a batch of zero NHWC float32 images (core/builder.py's contract)."""
    import tensorflow as tf

    network = builder.build(image_size, num_classes)
    if not isinstance(network, tf.keras.Model):
        raise builder.error(f"it returned {type(network).__name__}, not a tf.keras.Model")
    batch = tf.zeros((PROBE_BATCH, image_size, image_size, 3), tf.float32)
    builder.check_output(builder.run_probe(lambda x: network(x, training=False), batch, "NHWC", image_size),
                         num_classes, "NHWC")
    return network


def user_classifier(network, image_size: int):
    """The user's network as the trainer trains and saves it: uint8 pixels in (as the Parquet stores them),
    converted to float32 [0, 1], the network's logits, a softmax out. Keras computes the loss from the softmax's
    input (its logits), and the saved model outputs probabilities."""
    import tensorflow as tf

    inputs = tf.keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    pixels = tf.keras.layers.Rescaling(1 / 255, name="to_unit_range")(inputs)
    probabilities = tf.keras.layers.Softmax(name="probabilities")(network(pixels))
    return tf.keras.Model(inputs, probabilities, name=f"{network.name}_classifier")
