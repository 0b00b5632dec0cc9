"""The model.builder contract checks: a bad import path, a wrong signature or a wrong output shape fail before
training, naming the builder, the image and the Python error; a good builder is built and checked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalingrun_trainer.core.builder import Builder, BuilderError
from scalingrun_trainer.frameworks.keras.models import build_user_network, user_classifier
from tests.support.env import require

LIGHTNING_PYTHON = Path(__file__).resolve().parents[3] / ".venv-lightning/bin/python"
IMAGE = "registry.example/team/trainer:1.0"

KERAS_MODULE = '''
import tensorflow as tf

def build(input_shape, num_classes, width=8):
    inputs = tf.keras.Input(input_shape)
    x = tf.keras.layers.Conv2D(width, 3, activation="relu")(inputs)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))

def two_arguments(input_shape):
    return None

def wrong_output(input_shape, num_classes):
    inputs = tf.keras.Input(input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes + 1)(tf.keras.layers.Flatten()(inputs)))

def not_a_model(input_shape, num_classes):
    return "a string"

def raises(input_shape, num_classes):
    raise KeyError("no such layer")

def flat_only(input_shape, num_classes):
    inputs = tf.keras.Input((7,))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(inputs))

NOT_CALLABLE = 3
'''

TORCH_MODULE = '''
import torch

def build(input_shape, num_classes, width=8):
    return torch.nn.Sequential(torch.nn.Conv2d(input_shape[2], width, 3), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(width, num_classes))

def nhwc(input_shape, num_classes):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[0] * input_shape[1] * 3, num_classes),
                               torch.nn.Unflatten(1, (num_classes, 1)))
'''


@pytest.fixture
def package(tmp_path, monkeypatch) -> str:
    folder = tmp_path / "teamnets"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "keras_models.py").write_text(KERAS_MODULE)
    (folder / "torch_models.py").write_text(TORCH_MODULE)
    (folder / "broken.py").write_text("import tensorflow as tf\nthis is not python\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return str(tmp_path)


def failure(path: str, **params) -> str:
    with pytest.raises(BuilderError) as caught:
        build_user_network(Builder(path, params, IMAGE), 32, 5)
    message = str(caught.value)
    assert message.startswith(f"spec.model.builder {path!r} in image {IMAGE}: "), message
    return message


def test_a_good_builder_is_built_and_checked(package):
    network = build_user_network(Builder("teamnets.keras_models:build", {"width": 4}, IMAGE), 32, 5)
    assert network.output_shape == (None, 5)
    assert network.optimizer is None  # uncompiled: the trainer compiles it


@pytest.mark.parametrize("path,words", [
    ("teamnets.absent:build", "cannot import teamnets.absent (is the package in the image, or on PYTHONPATH / "
                              "--python-path locally?): ModuleNotFoundError: No module named 'teamnets.absent'"),
    ("otherteam.models:build", "ModuleNotFoundError: No module named 'otherteam'"),
    ("teamnets.broken:build", "cannot import teamnets.broken"),
    ("teamnets.keras_models:absent", "module teamnets.keras_models has no function absent (found nothing)"),
    ("teamnets.keras_models:NOT_CALLABLE", "has no function NOT_CALLABLE (found int)"),
])
def test_an_import_path_that_does_not_resolve_is_named(package, path, words):
    assert words in failure(path)


def test_a_wrong_signature_says_what_was_expected(package):
    message = failure("teamnets.keras_models:two_arguments")
    assert "wrong signature, expected function(input_shape, num_classes, **params)" in message
    assert "TypeError: too many positional arguments" in message
    message = failure("teamnets.keras_models:build", depth=3)
    assert "params ['depth']" in message and "unexpected keyword argument 'depth'" in message


def test_a_wrong_output_or_return_value_is_refused(package):
    assert ("the network returned shape (2, 6) for a batch of 2 NHWC images; it must return logits of shape "
            "(batch, num_classes) = (2, 5)") in failure("teamnets.keras_models:wrong_output")
    assert "it returned str, not a tf.keras.Model" in failure("teamnets.keras_models:not_a_model")
    assert "failed: KeyError: 'no such layer'" in failure("teamnets.keras_models:raises")
    assert "the network failed on a batch of 2 float32 images of shape (32, 32, 3) (NHWC): ValueError" in failure(
        "teamnets.keras_models:flat_only")


def test_the_torch_contract_in_the_lightning_environment(package):
    require(LIGHTNING_PYTHON.exists(), f"no {LIGHTNING_PYTHON}: SCALINGRUN_PROFILE=lightning scripts/setup.sh")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {package!r})
        from scalingrun_trainer.core.builder import Builder, BuilderError
        from scalingrun_trainer.frameworks.lightning.network import build_network
        network = build_network(Builder("teamnets.torch_models:build", {{"width": 4}}, "img"), 32, 5)
        print("built", type(network).__name__, network.training)
        for path in ("teamnets.torch_models:nhwc", "teamnets.keras_models:build"):
            try:
                build_network(Builder(path, None, "img"), 32, 5)
            except BuilderError as exc:
                print(exc)
        import torch
        from scalingrun_trainer.frameworks.lightning.network import BuilderNet

        seen = []
        class Spy(torch.nn.Module):
            def forward(self, x):
                seen.append((tuple(x.shape), x.dtype, float(x.max())))
                return torch.stack([40 * x.mean(dim=(1, 2, 3)), torch.zeros(len(x))], dim=1)
        net = BuilderNet(Spy())
        pixels = torch.full((2, 32, 32, 3), 255, dtype=torch.uint8)
        probabilities = net(pixels)
        print(seen[0], [round(float(p), 4) for p in probabilities.sum(dim=1)], float(net.logits(pixels)[0, 0]))
    """)
    result = subprocess.run([str(LIGHTNING_PYTHON), "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "built Sequential True"  # the check leaves the module in training mode
    assert ("the network returned shape (2, 5, 1) for a batch of 2 NCHW images; it must return logits of shape "
            "(batch, num_classes) = (2, 5)") in lines[1]
    assert "cannot import teamnets.keras_models" in lines[2] and "No module named 'tensorflow'" in lines[2]
    # The network saw float32 NCHW in [0, 1]; forward returns probabilities, logits() the network's own output.
    assert lines[3] == "((2, 3, 32, 32), torch.float32, 1.0) [1.0, 1.0] 40.0"


def test_the_trainer_feeds_unit_range_floats_and_computes_the_loss_from_logits(package):
    """uint8 pixels in, [0, 1] floats to the network, its logits to the loss, probabilities out of the saved model."""
    import numpy as np
    import tensorflow as tf

    inputs = tf.keras.Input((32, 32, 3))
    # Logits [40 * mean pixel, 0]: large enough that a loss taken from the probabilities would lose precision.
    logits = tf.keras.layers.Lambda(lambda x: tf.stack([40 * tf.reduce_mean(x, [1, 2, 3]),
                                                        tf.zeros_like(x[:, 0, 0, 0])], axis=1))(inputs)
    model = user_classifier(tf.keras.Model(inputs, logits, name="probe"), 32)
    assert model.input.dtype == tf.uint8
    pixels = np.full((2, 32, 32, 3), 255, np.uint8)
    pixels[1] = 0
    probabilities = model.predict(pixels, verbose=0)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert probabilities[0, 0] > 0.999 and probabilities[1, 0] == pytest.approx(0.5)  # mean 1.0 and 0.0
    model.compile(loss="sparse_categorical_crossentropy")
    loss = model.evaluate(pixels, np.array([1, 1]), verbose=0)
    expected = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        [1, 1], tf.constant([[40.0, 0.0], [0.0, 0.0]]), from_logits=True)))
    assert loss == pytest.approx(expected, rel=1e-5)  # 20.35: from a float32 probability it would be capped at 16.1
