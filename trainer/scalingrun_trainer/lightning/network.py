"""The user's torch network (spec.model.builder) as our Lightning trainer trains and saves it."""

from __future__ import annotations

import torch
from torch import nn


class BuilderNet(nn.Module):
    """uint8 NHWC pixels in (as the Parquet stores them), float32 NCHW in [0, 1] to the user's network, its logits
    for the loss, softmax probabilities out of forward (what the saved TorchScript returns): the interface of
    model.TransferNet."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.network(pixels.permute(0, 3, 1, 2).float() / 255)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(pixels), dim=1)
