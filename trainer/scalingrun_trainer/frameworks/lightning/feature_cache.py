"""The feature cache under Lightning (the rules: ../core/feature_cache.py): the base's forward pass that fills it,
and the cached batches as the loaders the LightningModule trains its head on (model.TransferClassifier with
on_features)."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from ...core.feature_cache import FeatureCacheData
from .data import EpochLengths


class ModuleWeights:
    """A module's state as core.feature_cache.Weights."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def get(self) -> dict[str, torch.Tensor]:
        return {name: value.detach().cpu() for name, value in self.module.state_dict().items()}

    def set(self, value: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(value)


def extractor(net) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 (n, side, side, 3) pixels -> float32 (n, width) pooled features; the base in inference mode."""

    def extract(pixels: np.ndarray) -> np.ndarray:
        net.base.eval()
        with torch.no_grad():
            return net.features(torch.from_numpy(np.ascontiguousarray(pixels))).numpy()

    return extract


def _tensors(batch: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    features, labels = batch
    return torch.from_numpy(np.ascontiguousarray(features)), torch.from_numpy(labels)


class CachedTrainBatches(EpochLengths):
    """Epochs of `steps` batches of cached features, from step `first_step` of `first_epoch` on: a resumed epoch's
    rest is exactly the rows it had not trained on (core/feature_cache.py: epoch_rows)."""

    def __init__(self, cache: FeatureCacheData, *, first_epoch: int, steps: int, batch_size: int, first_step: int = 0):
        super().__init__(steps, first_step)
        self.cache = cache
        self._batches = cache.train_batches(first_epoch, steps, batch_size, first_step=first_step)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _tensors(next(self._batches))

    def close(self) -> None:
        self.cache.close()


class CachedValidationBatches:
    """This rank's validation features, in order, once per iteration."""

    def __init__(self, cache: FeatureCacheData, *, batch_size: int):
        self.cache, self.batch_size = cache, batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.cache.validation_batches(self.batch_size):
            yield _tensors(batch)
