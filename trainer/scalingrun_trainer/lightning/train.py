"""PyTorch Lightning DDP transfer learning, started by mpirun (one process per GPU, or per worker on CPU).

Rank, world size and the master address come from MPI (Lightning's MPIEnvironment over mpi4py); the process
group is gloo on CPU and nccl on GPU. Only rank 0 logs, writes progress and checkpoints, and saves the model.
"""

from __future__ import annotations

import io
import os
import sys
import time
import warnings
from typing import Any, Optional

from ..builder import TORCH, BuilderError, build_network
from ..data import DatasetError, check_shardable, open_dataset
from ..models import ModelError, local_weights
from ..scaling import scale_run
from ..storage import open_location
from ..progress import error_line
from ..tracking import TrackingError, start_tracking
from ..weights import WeightsError

FRAMEWORK = "pytorch-lightning"


class TrainingError(RuntimeError):
    """A configuration or data problem; every rank exits with its one-line cause."""


def _mpi():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def train(config: dict[str, Any]) -> int:
    comm = _mpi()
    rank, size = comm.Get_rank(), comm.Get_size()
    context: dict[str, Any] = {}  # rank 0's ProgressWriter and RunTracker, to report a failure
    try:
        return _train(config, comm, rank, size, context)
    except (TrainingError, DatasetError, ModelError, WeightsError, BuilderError, TrackingError, ValueError,
            OSError) as exc:
        message = error_line(exc)
        print(f"scalingrun-trainer train (pytorch-lightning, rank {rank}/{size}): error: {message}",
              file=sys.stderr, flush=True)
        if context.get("progress") is not None:
            context["progress"].finish("failed", error=message)
        if context.get("tracker") is not None:
            context["tracker"].finish("FAILED", error=message)
        return 2


def _mpi_environment():
    """Lightning's MPIEnvironment, with rank 0's IP address as the main address instead of its hostname: an
    MPIJob worker's hostname (<job>-worker-0) is not resolvable from the other pods (only its FQDN under the
    worker Service is), while its IP is reachable from all of them."""
    import socket

    from lightning_fabric.plugins.environments import MPIEnvironment

    class PodMPIEnvironment(MPIEnvironment):
        def _get_main_address(self) -> str:
            address = os.environ.get("MASTER_ADDR")
            if not address:
                try:
                    address = socket.gethostbyname(socket.gethostname())
                except OSError:
                    address = socket.gethostname()
            return self._comm_world.bcast(address, root=0)

    return PodMPIEnvironment()


def _devices(size: int) -> tuple[str, int, int]:
    """(accelerator, devices, num_nodes): devices = processes on this host (mpirun's local size)."""
    import torch

    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("MPI_LOCALNRANKS", size)))
    if size % local:
        raise TrainingError(f"{size} processes do not split evenly into hosts of {local}: give every worker "
                            "the same number of slots")
    return ("gpu" if torch.cuda.is_available() else "cpu"), local, size // local


def _train(config: dict[str, Any], comm, rank: int, size: int, context: dict[str, Any]) -> int:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.strategies import DDPStrategy

    from ..progress import ProgressWriter, write_failed
    from .callbacks import Checkpointer, EarlyStopping, EpochEnd, load_checkpoint, load_resume_state
    from .data import TrainBatches, ValidationBatches
    from .model import BASES, TransferClassifier
    from .network import BuilderNet
    from ..train import _network_name

    log = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    accelerator, local_size, nodes = _devices(size)
    if accelerator == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        # A share of the cores per process: torch's default (all cores in every process) oversubscribes the host.
        # In an MPIJob the operator sets OMP_NUM_THREADS from the worker's CPU limit instead.
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_size))
    storage = config.get("storage") or {}
    endpoint, region = storage.get("endpoint"), storage.get("region")
    spec_data, spec_model, spec_train = config["dataset"], config["model"], config["training"]
    if not spec_model.get("builder") and spec_model["base"] not in BASES:
        raise TrainingError(f"model.base {spec_model['base']} is not available with pytorch-lightning "
                            f"(only {', '.join(BASES)})")
    run_root = open_location(config["runLocation"], endpoint, region)
    seed = int(spec_data.get("seed", 42))
    pl.seed_everything(seed, workers=False, verbose=False)  # the same initial head on every rank

    dataset = open_dataset(spec_data["output"], endpoint, region)
    check_shardable(dataset, size)
    classes = len(dataset.classes)
    if spec_model.get("numClasses") and spec_model["numClasses"] != classes:
        raise TrainingError(f"model.numClasses is {spec_model['numClasses']} but the dataset has {classes} "
                            f"classes ({', '.join(dataset.classes[:5])}...): remove numClasses or fix the data")
    network = None
    if spec_model.get("builder"):
        # The user's network, checked before anything else (builder.py's contract).
        try:
            network = BuilderNet(build_network(spec_model["builder"], dataset.image_size, classes, TORCH,
                                               spec_model.get("params"), config.get("image")))
        except BuilderError as exc:
            if rank == 0:
                write_failed(run_root.join("progress.json"), max_epochs=int(spec_train["maxEpochs"]),
                             processes=size, error=error_line(exc))
            raise
    scaled = scale_run(dataset.rows["train"], spec_train["batchSizePerWorker"], spec_train["baseLearningRate"],
                       spec_train["learningRateScaling"], size)
    log(f"scalingrun-trainer ({FRAMEWORK}, {accelerator}): {scaled.describe()}; {dataset.rows['train']} train / "
        f"{dataset.rows['validation']} validation rows, {classes} classes")

    checkpoints = run_root.join("checkpoints")
    state = load_resume_state(checkpoints) if spec_train.get("resume", True) else None
    trained_on = {"dataset": dataset.fingerprint, "base": _network_name(spec_model), "classes": classes,
                  "input": "uint8", "framework": FRAMEWORK}
    if state and state.get("trainedOn") != trained_on:
        log(f"the checkpoint in {checkpoints.uri} is for another dataset, model or framework "
            f"({state.get('trainedOn')}): starting from scratch")
        state = None
    initial_epoch = int(state["epoch"]) if state else 0
    max_epochs = int(spec_train["maxEpochs"])
    if state and state.get("finished"):
        log(f"run already finished after epoch {initial_epoch} (see {run_root.uri}/progress.json): "
            "nothing to train; use a new run name to train again")
        return 0

    from ..train import _run_params

    tracker = start_tracking(config, rank, run_root.uri,
                             {**_run_params(config, dataset, scaled, size), "framework": FRAMEWORK},
                             (state or {}).get("mlflowRunId"), log, lambda error: comm.bcast(error, root=0))
    context["tracker"] = tracker
    weights = local_weights(spec_model.get("weights") or "imagenet", endpoint, region) if network is None else None
    module = TransferClassifier(classes, spec_model.get("dropout") or 0.0, weights,
                                bool(spec_model.get("trainableBase")), spec_train["optimizer"], scaled.learning_rate,
                                net=network)
    resumed = load_checkpoint(checkpoints, state) if state else None
    if resumed:
        module.load_state_dict(resumed["model"])
        module.resume_optimizer = resumed["optimizer"]

    stopping = spec_train.get("earlyStopping") or {}
    monitor = stopping.get("monitor", "val_loss")
    early_stopping = None
    if stopping.get("enabled", True):
        early_stopping = EarlyStopping(monitor, stopping.get("patience", 3), stopping.get("minDelta", 0.0),
                                       stopping.get("restoreBestWeights", True), stopping.get("stoppingThreshold"))
        if state and state.get("earlyStopping"):
            early_stopping.resume_from(state["earlyStopping"], (resumed or {}).get("best"))

    progress = checkpointer = None
    best: tuple[Optional[int], dict] = (None, {})
    if state:
        best = _best_so_far(state.get("history", []), (state.get("earlyStopping") or {}).get("bestEpoch"), monitor)
    if rank == 0:
        progress = ProgressWriter(run_root.join("progress.json"), max_epochs=max_epochs, processes=size,
                                  learning_rate=scaled.learning_rate, effective_batch_size=scaled.effective_batch_size,
                                  history=state.get("history") if state else None,
                                  mlflow_run_id=tracker.run_id if tracker else None,
                                  resumed_from_epoch=initial_epoch if state else None)
        context["progress"] = progress
        progress.start(best_epoch=best[0])
        every = int((spec_train.get("checkpoint") or {}).get("everyEpochs", 1))
        checkpointer = Checkpointer(checkpoints, every, progress,
                                    {"trainedOn": trained_on, "mlflowRunId": tracker.run_id if tracker else None})
        if initial_epoch:
            log(f"resuming after epoch {initial_epoch} from {checkpoints.uri}")
    epoch_end = EpochEnd(initial_epoch=initial_epoch, images_per_epoch=scaled.steps_per_epoch * scaled.effective_batch_size,
                         monitor=monitor, early_stopping=early_stopping, progress=progress, tracker=tracker,
                         checkpointer=checkpointer, log=log, best=best)

    train_data = TrainBatches(dataset, rank=rank, size=size, batch_size=scaled.batch_size_per_worker,
                              steps=scaled.steps_per_epoch, seed=seed)
    val_data = ValidationBatches(dataset, rank=rank, size=size, batch_size=scaled.batch_size_per_worker, seed=seed)
    strategy = DDPStrategy(
        cluster_environment=_mpi_environment(), process_group_backend="nccl" if accelerator == "gpu" else "gloo",
        # No buffer sync in forward: it is a collective, and ranks hold different numbers of validation
        # batches. Buffers are synced once at the start; BatchNorm statistics of a trainable base then stay
        # per rank, as with Horovod, and rank 0's are saved.
        forward_sync_buffers=False,
    )
    trainer = pl.Trainer(
        accelerator=accelerator, devices=local_size, num_nodes=nodes, strategy=strategy,
        max_epochs=max_epochs - initial_epoch, num_sanity_val_steps=0, use_distributed_sampler=False,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[epoch_end],
    )
    os.environ.setdefault("LITLOGGER_DISABLE_TIP", "1")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*Total length of .* across ranks is zero.*")
    started = time.monotonic()
    try:
        if initial_epoch < max_epochs:
            trainer.fit(module, train_dataloaders=train_data, val_dataloaders=val_data)
    finally:
        train_data.close()

    if rank == 0:
        model_uri = _save_model(module, dataset.image_size, run_root.join("model"))
        progress.finish("succeeded", model_uri=model_uri)
        document = progress.document
        if tracker is not None:
            tracker.finish("FINISHED", best_epoch=document["bestEpoch"], best_metrics=document["bestMetrics"],
                           model_uri=model_uri)
        log(f"done in {time.monotonic() - started:.0f} s: best epoch {document['bestEpoch']} "
            f"{document['bestMetrics']}; model {model_uri}")
    return 0


def _best_so_far(history: list[dict], best_epoch: Optional[int], monitor: str) -> tuple[Optional[int], dict]:
    """The best epoch of a resumed training: early stopping's when it ran, else the best monitored value."""
    from .callbacks import better

    best: tuple[Optional[int], dict] = (None, {})
    for entry in history:
        metrics = {k: v for k, v in entry.items() if k not in ("epoch", "imagesPerSecond")}
        if entry["epoch"] == best_epoch or (
                best_epoch is None and better(monitor, metrics.get(monitor), best[1].get(monitor))):
            best = (entry["epoch"], metrics)
    return best


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
