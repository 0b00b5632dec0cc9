"""The user's torch network (spec.model.builder), checked and wrapped as our Lightning trainer trains and saves it."""

from __future__ import annotations

import torch
from torch import nn

from ...core.builder import PROBE_BATCH, Builder


def build_network(builder: Builder, image_size: int, num_classes: int) -> nn.Module:
    """The user's torch.nn.Module, checked on a batch of zero NCHW float32 images (core/builder.py's contract); it
    is left in the training mode it came in."""
    network = builder.build(image_size, num_classes)
    if not isinstance(network, nn.Module):
        raise builder.error(f"it returned {type(network).__name__}, not a torch.nn.Module")
    was_training = network.training
    network.eval()
    try:
        with torch.no_grad():
            batch = torch.zeros((PROBE_BATCH, 3, image_size, image_size), dtype=torch.float32)
            shape = builder.run_probe(network, batch, "NCHW", image_size)
    finally:
        network.train(was_training)
    builder.check_output(shape, num_classes, "NCHW")
    return network


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
