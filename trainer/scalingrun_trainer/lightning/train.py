"""PyTorch Lightning + DDP transfer learning, started by mpirun (one process per GPU, or per worker on CPU).

Rank, world size and the master address come from MPI (Lightning's MPIEnvironment over mpi4py); the process
group is gloo on CPU and nccl on GPU. Only rank 0 logs, writes progress and checkpoints, and saves the model;
what every engine does around the training is ../core's.
"""

from __future__ import annotations

import io
import os
import time
import warnings
from datetime import timedelta

from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import Devices
from ..core.builder import Builder
from ..core.feature_cache import cache_features
from ..core.mpi import MpiWorld, host_address, local_rank_and_size
from ..core.scaling import scale_run
from ..core.session import Attempt, TrainingError
from ..core.stall import engine_timeout
from ..core.weights import local_weights

FRAMEWORK = "pytorch-lightning"


def train(config: TrainerConfig) -> int:
    attempt = Attempt(config, MpiWorld(), engine=FRAMEWORK, trained_on={"framework": FRAMEWORK})
    return attempt.run(lambda: _train(attempt))


def _mpi_environment():
    """Lightning's MPIEnvironment, with rank 0's IP address as the main address instead of its hostname (see
    core.mpi.host_address)."""
    from lightning_fabric.plugins.environments import MPIEnvironment

    class PodMPIEnvironment(MPIEnvironment):
        def _get_main_address(self) -> str:
            return self._comm_world.bcast(os.environ.get("MASTER_ADDR") or host_address(), root=0)

    return PodMPIEnvironment()


def _devices(rank: int, size: int) -> tuple[str, int, int]:
    """(accelerator, devices, num_nodes): devices = processes on this host (mpirun's local size)."""
    import torch

    _, local = local_rank_and_size(rank, size)
    if size % local:
        raise TrainingError(f"{size} processes do not split evenly into hosts of {local}: give every worker "
                            "the same number of slots")
    return ("gpu" if torch.cuda.is_available() else "cpu"), local, size // local


def _train(attempt: Attempt) -> int:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.strategies import DDPStrategy

    from ..core.progress import EpochRecorder
    from .callbacks import Checkpointer, EarlyStopping, EpochEnd, Heartbeat, load_checkpoint
    from .model import BASES, TransferClassifier
    from .network import BuilderNet, build_network

    config, rank, size, log = attempt.config, attempt.rank, attempt.size, attempt.log
    model_spec, training, seed = config.model, config.training, config.dataset.seed
    accelerator, local_size, nodes = _devices(rank, size)
    # DDP: one GPU per process.
    attempt.devices = (Devices(kind="gpu", count=1, name=torch.cuda.get_device_name(0)) if accelerator == "gpu"
                       else Devices(kind="cpu", count=0))
    if accelerator == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        # A share of the cores per process: torch's default (all cores in every process) oversubscribes the host.
        # In an MPIJob the operator sets OMP_NUM_THREADS from the worker's CPU limit instead.
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
    if not model_spec.builder and model_spec.base not in BASES:
        raise TrainingError(f"model.base {model_spec.base} is not available with pytorch-lightning "
                            f"(only {', '.join(BASES)})")
    pl.seed_everything(seed, workers=False, verbose=False)  # the same initial head on every rank

    finished = not attempt.open()
    dataset, state = attempt.dataset, attempt.state
    network = None
    if model_spec.builder:
        # The user's network, checked before anything else (core/builder.py's contract).
        network = BuilderNet(build_network(Builder.of(model_spec, config.image), dataset.image_size, attempt.classes))
    scaled = scale_run(dataset.rows["train"], training.batch_size_per_worker, training.base_learning_rate,
                       training.learning_rate_scaling, size)
    log(f"scalingrun-trainer ({FRAMEWORK}, {accelerator}): {scaled.describe()}; {dataset.rows['train']} train / "
        f"{dataset.rows['validation']} validation rows, {attempt.classes} classes")
    if finished:
        return 0

    tracker = attempt.start_tracking(scaled, framework=FRAMEWORK)
    weights = local_weights(model_spec.weights, attempt.endpoint, attempt.region) if network is None else None
    module = TransferClassifier(attempt.classes, model_spec.dropout or 0.0, weights, bool(model_spec.trainable_base),
                                training.optimizer, scaled.learning_rate, net=network)
    resumed = None
    if state:
        attempt.heartbeat.beat("restore")
        resumed = load_checkpoint(attempt.checkpoints, state)
        attempt.heartbeat.beat("restore")
    if resumed:
        module.load_state_dict(resumed["model"])
        module.resume_optimizer = resumed["optimizer"]

    stopping = training.early_stopping
    early_stopping = None
    if stopping.enabled:
        early_stopping = EarlyStopping(stopping.monitor, stopping.patience, stopping.min_delta,
                                       stopping.restore_best_weights, stopping.stopping_threshold)
        if state and state.early_stopping:
            early_stopping.resume_from(state.early_stopping, (resumed or {}).get("best"))

    recorder = checkpointer = None
    if rank == 0:
        progress = attempt.start_progress(scaled)
        recorder = EpochRecorder(progress, stopping.monitor, early_stopping=early_stopping is not None,
                                 tracker=tracker, log=log, best=attempt.best_so_far())
        checkpointer = Checkpointer(attempt.checkpoints, training.checkpoint.every_epochs, progress.history,
                                    attempt.resume_facts())
    epoch_end = EpochEnd(initial_epoch=attempt.initial_epoch,
                         images_per_epoch=scaled.steps_per_epoch * scaled.effective_batch_size,
                         early_stopping=early_stopping, recorder=recorder, checkpointer=checkpointer)

    # The process group's timeout bounds every collective where the stall watch is not running (core/stall.py).
    timeout = engine_timeout()
    strategy = DDPStrategy(
        cluster_environment=_mpi_environment(), process_group_backend="nccl" if accelerator == "gpu" else "gloo",
        **({"timeout": timedelta(seconds=timeout)} if timeout else {}),
        # No buffer sync in forward: it is a collective, and ranks hold different numbers of validation
        # batches. Buffers are synced once at the start; BatchNorm statistics of a trainable base then stay
        # per rank, as with Horovod, and rank 0's are saved.
        forward_sync_buffers=False,
    )
    trainer = pl.Trainer(
        accelerator=accelerator, devices=local_size, num_nodes=nodes, strategy=strategy,
        max_epochs=training.max_epochs - attempt.initial_epoch, num_sanity_val_steps=0, use_distributed_sampler=False,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[epoch_end, Heartbeat(attempt.heartbeat, scaled.steps_per_epoch, attempt.initial_epoch,
                                        attempt.watch_peers())],
    )
    os.environ.setdefault("LITLOGGER_DISABLE_TIP", "1")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*Total length of .* across ranks is zero.*")
    attempt.started = time.monotonic()
    if attempt.initial_epoch < training.max_epochs:
        train_data, val_data = _inputs(attempt, module, scaled)
        try:
            trainer.fit(module, train_dataloaders=train_data, val_dataloaders=val_data)
        finally:
            train_data.close()

    if rank == 0:
        attempt.succeed(_save_model(module, dataset.image_size, attempt.run_root.join("model")))
    return 0


def _inputs(attempt: Attempt, module, scaled):
    """(training, validation) batches as the module takes them: Petastorm readers of pixels, or this rank's cached
    features (built here, every rank)."""
    from .data import TrainBatches, ValidationBatches
    from .feature_cache import CachedTrainBatches, CachedValidationBatches, ModuleWeights, extractor

    dataset, rank, size, seed = attempt.dataset, attempt.rank, attempt.size, attempt.config.dataset.seed
    batch_size, steps = scaled.batch_size_per_worker, scaled.steps_per_epoch
    if attempt.caches_features:
        cache = cache_features(attempt, extractor(module.net), batch_size, ModuleWeights(module))
        module.on_features = True
        return (CachedTrainBatches(cache, first_epoch=attempt.initial_epoch, steps=steps, batch_size=batch_size),
                CachedValidationBatches(cache, batch_size=batch_size))
    return (TrainBatches(dataset, rank=rank, size=size, batch_size=batch_size, steps=steps, seed=seed),
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
