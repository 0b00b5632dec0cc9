"""The transfer-learning model takes uint8 pixels and normalises them itself, exactly as each base's own
preprocess_input would, and its saved file loads with plain Keras (no project code needed to serve it)."""

from __future__ import annotations

import numpy as np
import pytest
import skimage.data as skimage_data
import tensorflow as tf
from PIL import Image

from scalingrun_trainer.frameworks.keras import efficientnet_lite
from scalingrun_trainer.frameworks.keras.models import INPUT_SCALING, ModelError, build_model, input_normalization

OWN_PREPROCESS_INPUT = {
    "efficientnet_lite0": efficientnet_lite.preprocess_input,
    "mobilenet_v2": tf.keras.applications.mobilenet_v2.preprocess_input,
    "xception": tf.keras.applications.xception.preprocess_input,
}


def photos(side: int) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(image).convert("RGB").resize((side, side)))
                     for image in (skimage_data.chelsea(), skimage_data.coffee(), skimage_data.astronaut())])


def test_every_base_has_its_own_normalisation():
    assert set(INPUT_SCALING) == set(OWN_PREPROCESS_INPUT)


@pytest.mark.parametrize("base", sorted(OWN_PREPROCESS_INPUT))
def test_in_model_normalisation_equals_the_bases_preprocess_input(base):
    pixels = photos(64)
    assert pixels.dtype == np.uint8 and pixels.min() < 20 and pixels.max() > 235  # a real range of values
    expected = OWN_PREPROCESS_INPUT[base](pixels.astype(np.float32).copy())
    got = input_normalization(base)(tf.constant(pixels)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_unknown_base_is_a_clear_error():
    with pytest.raises(ModelError, match="unknown base network 'resnet'"):
        input_normalization("resnet")


def test_model_takes_uint8_and_its_saved_file_loads_with_plain_keras(tmp_path):
    tf.keras.utils.set_random_seed(0)
    model = build_model("mobilenet_v2", 32, 3, weights=None, dropout=0.1, trainable_base=False)
    assert model.input.dtype == tf.uint8
    assert model.layers[1].name == "preprocess_input"
    pixels = photos(32)
    before = model.predict(pixels, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)  # safe mode, no custom objects
    np.testing.assert_allclose(loaded.predict(pixels, verbose=0), before, atol=1e-6)
    layer = loaded.get_layer("preprocess_input")  # the file itself carries the normalisation
    assert (layer.scale, layer.offset) == pytest.approx(INPUT_SCALING["mobilenet_v2"])
