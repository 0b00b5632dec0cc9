"""The same compact CNN in PyTorch: spec.model.builder "teamnets.torch_cnn:build" with framework pytorch-lightning.

The trainer calls build(input_shape, num_classes, **spec.model.params), input_shape = (imageSize, imageSize, 3),
and feeds float32 images in [0, 1] (NCHW); the network returns logits.
"""

from torch import nn


def build(input_shape, num_classes, width=32, dropout=0.2):
    layers, channels = [], input_shape[2]
    for depth in (width, 2 * width, 4 * width):
        layers += [nn.Conv2d(channels, depth, 3, padding=1, bias=False), nn.BatchNorm2d(depth), nn.ReLU(),
                   nn.MaxPool2d(2)]
        channels = depth
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
                         nn.Linear(channels, num_classes))
