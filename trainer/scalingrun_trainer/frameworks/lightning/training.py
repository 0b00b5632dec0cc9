"""core.training's TrainingFramework for PyTorch Lightning: build, restore, fit and save a TransferClassifier (or the
user's network) on the strategy its engine gives (engines/lightning_ddp: DDP under mpirun)."""

from __future__ import annotations

import io
import os
import warnings
from typing import Any, Callable, Optional

from scalingrun_api.models import Framework

from ...core.builder import Builder
from ...core.checkpoints import CheckpointState
from ...core.early_stopping import EarlyStoppingRule
from ...core.probe import ProbeResult
from ...core.progress import EpochRecorder
from ...core.scaling import ScaledRun, scale_run
from ...core.session import Attempt, TrainingError, cache_features

FRAMEWORK = Framework.pytorch_lightning.value


class LightningTraining:
    """`accelerator` ("gpu" or "cpu"), `local_size` processes on this host of `nodes`; `strategy()` makes the
    Trainer's strategy."""

    def __init__(self, attempt: Attempt, accelerator: str, local_size: int, nodes: int, strategy: Callable[[], Any]):
        self.attempt, self.accelerator, self.local_size, self.nodes = attempt, accelerator, local_size, nodes
        self.strategy = strategy
        self.network = self.module = self.trainer = None

    def prepare(self) -> None:
        import pytorch_lightning as pl
        import torch

        from .model import BASES

        model = self.attempt.config.model
        if self.accelerator == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
            # A share of the cores per process: torch's default (all cores in every process) oversubscribes the
            # host. In an MPIJob the operator sets OMP_NUM_THREADS from the worker's CPU limit instead.
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // self.local_size))
        if not model.builder and model.base not in BASES:
            raise TrainingError(f"model.base {model.base} is not available with pytorch-lightning "
                                f"(only {', '.join(BASES)})")
        pl.seed_everything(self.attempt.config.dataset.seed, workers=False, verbose=False)  # the same initial head

    def check_network(self) -> None:
        from .network import BuilderNet, build_network

        attempt = self.attempt
        if attempt.config.model.builder:
            # The user's network, checked before anything else (core/builder.py's contract).
            self.network = BuilderNet(build_network(Builder.of(attempt.config.model, attempt.config.image),
                                                    attempt.dataset.image_size, attempt.classes))

    def scale(self, weights: Optional[str]) -> tuple[ScaledRun, Optional[ProbeResult]]:
        training = self.attempt.config.training
        return scale_run(self.attempt.dataset.rows["train"], training.batch_size_per_worker,
                         training.base_learning_rate, training.learning_rate_scaling, self.attempt.size,
                         self.attempt.config.processes), None

    def heading(self, scaled: ScaledRun) -> str:
        return f"scalingrun-trainer ({FRAMEWORK}, {self.accelerator}): {scaled.describe()}"

    def run_params(self) -> dict[str, Any]:
        return {"framework": FRAMEWORK}

    def scope(self):
        import contextlib

        return contextlib.nullcontext()

    def build(self, scaled: ScaledRun, weights: Optional[str]) -> None:
        from .model import TransferClassifier

        attempt, model = self.attempt, self.attempt.config.model
        self.module = TransferClassifier(attempt.classes, model.dropout or 0.0, weights, bool(model.trainable_base),
                                         attempt.config.training.optimizer, scaled.learning_rate, net=self.network)

    def restore(self, state: CheckpointState) -> Any:
        from .callbacks import load_checkpoint

        resumed = load_checkpoint(self.attempt.checkpoints, state)
        if resumed:
            self.module.load_state_dict(resumed["model"])
            self.module.resume_optimizer = resumed["optimizer"]
        return (resumed or {}).get("best")

    def early_stopping(self, rule: EarlyStoppingRule, restore_best_weights: bool):
        from .callbacks import EarlyStopping

        return EarlyStopping(rule, restore_best_weights)

    def prepare_fit(self, scaled: ScaledRun, early_stopping, recorder: Optional[EpochRecorder],
                    history: Callable[[], list[dict]], probe: Optional[dict]) -> None:
        import pytorch_lightning as pl

        from .callbacks import Checkpointer, EpochEnd, Heartbeat, PreemptionCheck

        attempt, training = self.attempt, self.attempt.config.training
        first_step, steps = attempt.initial_step, scaled.steps_per_epoch  # optimizer updates
        # The data, the beats and the preemption check count micro-batches (accumulation k: k per update).
        micro_steps, first_micro_step = scaled.micro_steps_per_epoch, first_step * scaled.accumulation
        checkpointer = None
        if attempt.rank == 0:
            checkpointer = Checkpointer(attempt.checkpoints, training.checkpoint.every_epochs, history,
                                        attempt.resume_facts())
        epoch_end = EpochEnd(initial_epoch=attempt.initial_epoch,
                             images_per_epoch=steps * scaled.effective_batch_size,
                             early_stopping=early_stopping, recorder=recorder, checkpointer=checkpointer,
                             skipped_images=first_step * scaled.effective_batch_size)
        self.trainer = pl.Trainer(
            accelerator=self.accelerator, devices=self.local_size, num_nodes=self.nodes, strategy=self.strategy(),
            max_epochs=training.max_epochs - attempt.initial_epoch, num_sanity_val_steps=0,
            use_distributed_sampler=False, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False,
            # A resumed epoch's rest is shorter than the epochs after it: Lightning reads each epoch's length anew.
            reload_dataloaders_every_n_epochs=1 if first_step else 0,
            # Fewer processes than the spec's: Lightning counts micro-batches and steps the optimizer every k of
            # them (DDP skips the all-reduce on the others), so an epoch takes the full-size run's updates.
            accumulate_grad_batches=scaled.accumulation,
            callbacks=[epoch_end,
                       Heartbeat(attempt.heartbeat, micro_steps, attempt.initial_epoch, attempt.watch_peers(),
                                 first_micro_step),
                       PreemptionCheck(attempt.notice, attempt.world, micro_steps, attempt.initial_epoch,
                                       first_micro_step, checkpointer, early_stopping, scaled.accumulation)],
        )
        os.environ.setdefault("LITLOGGER_DISABLE_TIP", "1")
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")
        warnings.filterwarnings("ignore", message=".*Total length of .* across ranks is zero.*")

    def fit(self, scaled: ScaledRun) -> None:
        train_data, val_data = self._inputs(scaled)
        try:
            self.trainer.fit(self.module, train_dataloaders=train_data, val_dataloaders=val_data)
        finally:
            train_data.close()

    def save(self) -> Optional[str]:
        if self.attempt.rank != 0:
            return None
        return _save_model(self.module, self.attempt.dataset.image_size, self.attempt.run_root.join("model"))

    def _inputs(self, scaled: ScaledRun):
        """(training, validation) batches as the module takes them: Petastorm readers of pixels, or this rank's
        cached features (built here, every rank); a resumed epoch from its step (exact rows with cached features
        only: data.TrainBatches)."""
        from .data import TrainBatches, ValidationBatches
        from .feature_cache import CachedTrainBatches, CachedValidationBatches, ModuleWeights, extractor

        attempt, module = self.attempt, self.module
        dataset, rank, size, seed = attempt.dataset, attempt.rank, attempt.size, attempt.config.dataset.seed
        batch_size, steps = scaled.batch_size_per_worker, scaled.micro_steps_per_epoch
        first_step = attempt.initial_step * scaled.accumulation  # a step checkpoint counts optimizer updates
        if attempt.caches_features:
            cache = cache_features(attempt, extractor(module.net), batch_size, ModuleWeights(module))
            module.on_features = True
            return (CachedTrainBatches(cache, first_epoch=attempt.initial_epoch, steps=steps, batch_size=batch_size,
                                       first_step=first_step),
                    CachedValidationBatches(cache, batch_size=batch_size))
        return (TrainBatches(dataset, rank=rank, size=size, batch_size=batch_size, steps=steps, seed=seed,
                             first_step=first_step),
                ValidationBatches(dataset, rank=rank, size=size, batch_size=batch_size, seed=seed))


def _save_model(module, image_size: int, target) -> str:
    """TorchScript (`torch.jit.load(path)`): uint8 (N, imageSize, imageSize, 3) pixels in, class probabilities
    out; no scalingrun or Lightning code needed to load it."""
    import torch

    net = module.net.cpu().eval()
    example = torch.zeros((1, image_size, image_size, 3), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # TF 'same' padding: fixed for imageSize
        scripted = torch.jit.trace(net, example)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    target.join("model.pt").write_bytes_atomic(buffer.getvalue())
    return target.join("model.pt").uri
