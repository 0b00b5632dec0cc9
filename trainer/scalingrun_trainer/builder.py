"""spec.model.builder: the user's own network, "package.module:function", checked before any training step.

The contract: function(input_shape, num_classes, **params) returns an uncompiled tf.keras.Model (Keras) or a
torch.nn.Module (Lightning) that takes float32 images in [0, 1] (NHWC for Keras, NCHW for torch) and returns
logits of shape (batch, num_classes). `build_network` imports it, binds the arguments, builds, and runs a batch of
2 zero images through it; any failure is a BuilderError naming the builder, the image and the Python error, so
that the run fails with that message before training and nothing reaches modelUri.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Optional

KERAS = "keras"
TORCH = "torch"
PROBE_BATCH = 2


class BuilderError(RuntimeError):
    """The builder cannot be used; the message names it, the image and the Python error."""


class Builder:
    def __init__(self, path: str, params: Optional[dict[str, Any]] = None, image: Optional[str] = None):
        self.path, self.params, self.image = path, dict(params or {}), image or "this environment"

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

    def call(self, function: Callable[..., Any], input_shape: tuple[int, ...], num_classes: int) -> Any:
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

    def check_output(self, shape: tuple, num_classes: int, layout: str) -> None:
        wanted = (PROBE_BATCH, num_classes)
        if tuple(shape) != wanted:
            raise self.error(f"the network returned shape {tuple(shape)} for a batch of {PROBE_BATCH} {layout} "
                             f"images; it must return logits of shape (batch, num_classes) = {wanted}")


def build_network(path: str, image_size: int, num_classes: int, kind: str, params: Optional[dict[str, Any]] = None,
                  image: Optional[str] = None):
    """The user's network, built and checked: a tf.keras.Model (kind keras) or a torch.nn.Module (kind torch)."""
    builder = Builder(path, params, image)
    function = builder.load()
    if kind == KERAS:
        return _keras_network(builder, function, image_size, num_classes)
    if kind == TORCH:
        return _torch_network(builder, function, image_size, num_classes)
    raise ValueError(f"unknown kind {kind!r}")


def _keras_network(builder: Builder, function, image_size: int, num_classes: int):
    import tensorflow as tf

    network = builder.call(function, (image_size, image_size, 3), num_classes)
    if not isinstance(network, tf.keras.Model):
        raise builder.error(f"it returned {type(network).__name__}, not a tf.keras.Model")
    try:
        output = network(tf.zeros((PROBE_BATCH, image_size, image_size, 3), tf.float32), training=False)
    except Exception as exc:  # noqa: BLE001
        raise builder.error(f"the network failed on a batch of {PROBE_BATCH} float32 images of shape "
                            f"({image_size}, {image_size}, 3) (NHWC)", exc) from exc
    builder.check_output(tuple(getattr(output, "shape", ())), num_classes, "NHWC")
    return network


def _torch_network(builder: Builder, function, image_size: int, num_classes: int):
    import torch

    network = builder.call(function, (image_size, image_size, 3), num_classes)
    if not isinstance(network, torch.nn.Module):
        raise builder.error(f"it returned {type(network).__name__}, not a torch.nn.Module")
    was_training = network.training
    network.eval()
    try:
        with torch.no_grad():
            output = network(torch.zeros((PROBE_BATCH, 3, image_size, image_size), dtype=torch.float32))
    except Exception as exc:  # noqa: BLE001
        raise builder.error(f"the network failed on a batch of {PROBE_BATCH} float32 images of shape "
                            f"(3, {image_size}, {image_size}) (NCHW)", exc) from exc
    finally:
        network.train(was_training)
    builder.check_output(tuple(getattr(output, "shape", ())), num_classes, "NCHW")
    return network


def keras_classifier(network, image_size: int):
    """The user's network as our trainer trains and saves it: uint8 pixels in (as the Parquet stores them),
    converted to float32 [0, 1], the network's logits, a softmax out. Keras computes the loss from the softmax's
    input (its logits), and the saved model outputs probabilities."""
    import tensorflow as tf

    inputs = tf.keras.Input((image_size, image_size, 3), dtype="uint8", name="image")
    pixels = tf.keras.layers.Rescaling(1 / 255, name="to_unit_range")(inputs)
    probabilities = tf.keras.layers.Softmax(name="probabilities")(network(pixels))
    return tf.keras.Model(inputs, probabilities, name=f"{network.name}_classifier")
