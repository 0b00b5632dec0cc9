"""The transfer-learning classifier as a LightningModule: uint8 NHWC pixels in (as the Parquet stores them),
the base's normalisation inside the model, EfficientNet-Lite0, dropout, a linear head (softmax in the loss,
and in the exported model)."""

from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from .efficientnet_lite import MEAN, STDDEV, EfficientNetLite0Features, load_base_weights

BASES = ("efficientnet_lite0",)


class TransferNet(nn.Module):
    """What is saved to modelUri: (N, H, W, 3) uint8 in, (N, classes) softmax probabilities out (eval mode).

    The base's weights are channels-last, as the pixels arrive (NHWC), so oneDNN does not reorder them per call
    (bit-identical results). frozen_base: the base runs without autograd (no graph is kept for it; the head trains
    as before) and, in inference mode, with its BatchNorms folded into the convolutions (efficientnet_lite.py:
    1.19x on CPU, equal up to float rounding).
    """

    def __init__(self, num_classes: int, dropout: float):
        super().__init__()
        self.base = EfficientNetLite0Features().to(memory_format=torch.channels_last)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(1280, num_classes)
        self.frozen_base = False

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The base's pooled features of uint8 NHWC pixels (what the feature cache keeps)."""
        x = ((pixels.permute(0, 3, 1, 2).float() - MEAN) / STDDEV).contiguous(memory_format=torch.channels_last)
        if self.frozen_base and not self.base.training:
            return self.base.frozen_forward(x)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen_base):
            return self.base(x)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """Logits of pooled features: the head (dropout, linear)."""
        return self.head(self.dropout(features))

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(pixels))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(pixels), dim=1)


def _optimizer(name: str, parameters, learning_rate: float) -> torch.optim.Optimizer:
    # Keras' defaults where PyTorch's differ (epsilon 1e-7, SGD momentum 0.9 as the Keras trainer uses).
    if name == "nadam":
        return torch.optim.NAdam(parameters, lr=learning_rate, eps=1e-7)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=learning_rate, eps=1e-7)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=learning_rate, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")


class TransferClassifier(pl.LightningModule):
    """Sums loss and correct predictions per epoch on each rank; `epoch_metrics()` all-reduces them, so every
    rank sees the same loss/accuracy/val_loss/val_accuracy (exact, weighted by rows) and stops on the same epoch.
    With `on_features` its batches are the frozen base's cached features, not pixels (../core/feature_cache.py)."""

    def __init__(self, num_classes: int, dropout: float, weights: Optional[str], trainable_base: bool,
                 optimizer: str, learning_rate: float, net: Optional[nn.Module] = None):
        """`net`: the user's network (model.builder) as a network.BuilderNet, trained whole, instead of the base
        and head."""
        super().__init__()
        self.net = net if net is not None else TransferNet(num_classes, dropout)
        self.trainable_base = trainable_base or net is not None
        if net is None:
            load_base_weights(self.net.base, weights)
            if not trainable_base:
                self.net.base.requires_grad_(False)
                self.net.frozen_base = True
        self.optimizer_name, self.learning_rate = optimizer, learning_rate
        self.resume_optimizer: Optional[dict] = None  # a checkpoint's optimizer state, loaded once it exists
        self.on_features = False
        self._sums = {"train": torch.zeros(3, dtype=torch.float64), "val": torch.zeros(3, dtype=torch.float64)}

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(pixels)

    def _step(self, batch, split: str) -> torch.Tensor:
        inputs, labels = batch
        logits = self.net.classify(inputs) if self.on_features else self.net.logits(inputs)
        loss = F.cross_entropy(logits, labels)
        with torch.no_grad():
            correct = (logits.argmax(dim=1) == labels).sum()
            self._sums[split] += torch.stack([loss.detach().double() * len(labels), correct.double(),
                                              torch.tensor(len(labels), dtype=torch.float64)]).cpu()
        return loss

    def training_step(self, batch, batch_idx):
        if not self.trainable_base and self.net.base.training:
            # A frozen base keeps BatchNorm in inference mode (the Keras transfer rule). Checked per step: Lightning
            # sets every submodule's mode itself (fit start, after each validation), past any train() override.
            self.net.base.eval()
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def configure_optimizers(self):
        return _optimizer(self.optimizer_name, [p for p in self.parameters() if p.requires_grad], self.learning_rate)

    def on_train_start(self):
        if self.resume_optimizer is not None:
            self.trainer.optimizers[0].load_state_dict(self.resume_optimizer)
            self.resume_optimizer = None

    def epoch_metrics(self) -> dict[str, float]:
        """This epoch's metrics over all ranks (a collective: every rank calls it once per epoch), then reset."""
        sums = torch.cat([self._sums["train"], self._sums["val"]])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            device = self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
            sums = sums.to(device)
            torch.distributed.all_reduce(sums)
            sums = sums.cpu()
        for split in self._sums:
            self._sums[split].zero_()
        loss, correct, rows, val_loss, val_correct, val_rows = sums.tolist()
        metrics = {"loss": loss / max(rows, 1), "accuracy": correct / max(rows, 1)}
        if val_rows:
            metrics.update(val_loss=val_loss / val_rows, val_accuracy=val_correct / val_rows)
        return metrics
