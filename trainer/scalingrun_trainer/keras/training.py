"""Horovod data-parallel transfer learning, launched by horovodrun or mpirun (one process per GPU).

Order of the callbacks matters: broadcast rank 0's initial variables, average the metrics across
ranks, and only then early stopping, so that every rank stops on the same epoch. Only rank 0 logs,
checkpoints and reports.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

from .data import DatasetError, check_shardable, make_dataset, open_dataset
from .input_wait import GpuSampler, InputClock, reader_delay
from .models import ModelError, build_model, local_weights
from .probe import OOM_AT_ENV, PROBE_START, ProbeError, ProbeResult, candidate_sizes, probe_ceiling
from .scaling import scale_auto_run, scale_run
from .storage import open_location
from .tracking import TrackingError, start_tracking


class TrainingError(RuntimeError):
    """A configuration or data problem; every rank exits with its one-line cause."""


def _optimizer(name: str, learning_rate: float):
    import tensorflow as tf

    # Legacy Keras optimizers: the ones Horovod 0.28's DistributedOptimizer wraps reliably on TF 2.15.
    optimizers = {
        "nadam": lambda: tf.keras.optimizers.legacy.Nadam(learning_rate),
        "adam": lambda: tf.keras.optimizers.legacy.Adam(learning_rate),
        "sgd": lambda: tf.keras.optimizers.legacy.SGD(learning_rate, momentum=0.9),
    }
    if name not in optimizers:
        raise TrainingError(f"unknown optimizer {name!r}")
    return optimizers[name]()


def _pin_gpu(local_rank: int) -> None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")


def train(config: dict[str, Any]) -> int:
    import horovod.tensorflow.keras as hvd

    hvd.init()
    _pin_gpu(hvd.local_rank())
    rank, size = hvd.rank(), hvd.size()
    context: dict[str, Any] = {}  # _train leaves rank 0's ProgressWriter and RunTracker here, to report a failure
    try:
        return _train(config, hvd, rank, size, context)
    except (TrainingError, DatasetError, ModelError, TrackingError, ProbeError, ValueError, OSError) as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"scalingrun-trainer train (rank {rank}/{size}): error: {message}", file=sys.stderr, flush=True)
        if context.get("progress") is not None:
            context["progress"].finish("failed", error=message)
        if context.get("tracker") is not None:
            context["tracker"].finish("FAILED", error=message)
        return 2


def _train(config: dict[str, Any], hvd, rank: int, size: int, context: dict[str, Any]) -> int:
    import tensorflow as tf

    from .callbacks import (
        Checkpointer, EpochReporter, InputWaitMeter, ResumableEarlyStopping, load_resume_state, restore,
    )
    from .progress import ProgressWriter

    log = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    storage = config.get("storage") or {}
    endpoint, region = storage.get("endpoint"), storage.get("region")
    spec_data, spec_model, spec_train = config["dataset"], config["model"], config["training"]
    run_root = open_location(config["runLocation"], endpoint, region)
    seed = int(spec_data.get("seed", 42))
    tf.keras.utils.set_random_seed(seed)  # same initial head on every rank; rank 0's is broadcast anyway

    dataset = open_dataset(spec_data["output"], endpoint, region)
    check_shardable(dataset, size)
    classes = len(dataset.classes)
    if spec_model.get("numClasses") and spec_model["numClasses"] != classes:
        raise TrainingError(f"model.numClasses is {spec_model['numClasses']} but the dataset has {classes} "
                            f"classes ({', '.join(dataset.classes[:5])}...): remove numClasses or fix the data")
    checkpoints = run_root.join("checkpoints")
    state = load_resume_state(checkpoints) if spec_train.get("resume", True) else None
    # "input": checkpoints of models that took float input (before uint8 + in-model normalisation) are not resumed.
    trained_on = {"dataset": dataset.fingerprint, "base": spec_model["base"], "classes": classes, "input": "uint8"}
    if state and state.get("trainedOn") != trained_on:
        log(f"the checkpoint in {checkpoints.uri} is for another dataset or model ({state.get('trainedOn')}): "
            "starting from scratch")
        state = None
    initial_epoch = int(state["epoch"]) if state else 0
    max_epochs = int(spec_train["maxEpochs"])
    if state and state.get("finished"):
        log(f"run already finished after epoch {initial_epoch} (see {run_root.uri}/progress.json): "
            "nothing to train; use a new run name to train again")
        return 0

    weights = local_weights(spec_model.get("weights", "imagenet"), endpoint, region)
    probe = None
    if spec_train["batchSizePerWorker"] == "auto":
        if state and (state.get("batchSizeProbe") or {}).get("chosen"):
            # A resumed training keeps the batch size (and so the learning rate) its checkpoint was trained with.
            probe = ProbeResult.from_document(state["batchSizeProbe"])
            log(f"scalingrun-trainer: batch size {probe.chosen} from the probe before the checkpoint")
        else:
            probe = _probe_batch_size(spec_model, dataset, classes, weights, spec_train, rank, size, log)
            tf.keras.utils.set_random_seed(seed)  # rank 0's probe drew numbers the other ranks did not
        scaled = scale_auto_run(dataset.rows["train"], probe.chosen, spec_train["baseLearningRate"],
                                spec_train["learningRateScaling"], size)
    else:
        scaled = scale_run(dataset.rows["train"], spec_train["batchSizePerWorker"], spec_train["baseLearningRate"],
                           spec_train["learningRateScaling"], size)
    log(f"scalingrun-trainer: {scaled.describe()}; {dataset.rows['train']} train / "
        f"{dataset.rows['validation']} validation rows, {classes} classes")

    tracker = start_tracking(config, rank, run_root.uri, _run_params(config, dataset, scaled, size),
                             (state or {}).get("mlflowRunId"), log, _broadcast_error)
    context["tracker"] = tracker
    model = build_model(spec_model["base"], dataset.image_size, classes, weights,
                        spec_model.get("dropout", 0.0), spec_model.get("trainableBase", False))
    optimizer = hvd.DistributedOptimizer(_optimizer(spec_train["optimizer"], scaled.learning_rate))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    # Every rank reads the same checkpoint, so that all create the same optimizer variables (a rank-0-only
    # restore leaves the ranks with different variable sets and the first broadcast waits forever);
    # rank 0's values are then broadcast as on a fresh start.
    best_weights = restore(checkpoints, state, checkpoint) if state else None

    stopping = spec_train.get("earlyStopping") or {}
    early_stopping = None
    if stopping.get("enabled", True):
        early_stopping = ResumableEarlyStopping(
            monitor=stopping.get("monitor", "val_loss"), patience=stopping.get("patience", 3),
            min_delta=stopping.get("minDelta", 0.0), restore_best_weights=stopping.get("restoreBestWeights", True),
            stopping_threshold=stopping.get("stoppingThreshold"), verbose=1 if rank == 0 else 0,
        )
        if state and state.get("earlyStopping"):
            early_stopping.resume_from(state["earlyStopping"], best_weights)

    clock = InputClock()
    gpu = GpuSampler.open(hvd.local_rank()) if tf.config.list_physical_devices("GPU") else None
    input_meter = InputWaitMeter(clock, gpu, combine=_combine_input_figures)
    callbacks: list = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                       input_meter]
    if early_stopping is not None:
        callbacks.append(early_stopping)
    progress = None
    if rank == 0:
        progress = ProgressWriter(run_root.join("progress.json"), max_epochs=max_epochs, processes=size,
                                  learning_rate=scaled.learning_rate, effective_batch_size=scaled.effective_batch_size,
                                  history=state.get("history") if state else None,
                                  mlflow_run_id=tracker.run_id if tracker else None,
                                  resumed_from_epoch=initial_epoch if state else None,
                                  batch_size_per_worker=scaled.batch_size_per_worker,
                                  batch_size_probe=probe.document() if probe else None)
        context["progress"] = progress
        monitor = stopping.get("monitor", "val_loss")
        reporter = EpochReporter(progress, scaled.steps_per_epoch * scaled.effective_batch_size, monitor,
                                 early_stopping, log=log, tracker=tracker, input_meter=input_meter)
        if state:
            reporter.resume(state.get("history", []), ((state.get("earlyStopping") or {}).get("bestEpoch")))
        progress.start(best_epoch=reporter.best[0])
        every = int((spec_train.get("checkpoint") or {}).get("everyEpochs", 1))
        tensorboard_dir = tempfile.mkdtemp(prefix="tensorboard-")
        resume_facts = {"trainedOn": trained_on, "mlflowRunId": tracker.run_id if tracker else None,
                        "batchSizeProbe": probe.document() if probe else None}
        callbacks += [reporter, Checkpointer(checkpoints, checkpoint, every, early_stopping, reporter, resume_facts),
                      tf.keras.callbacks.TensorBoard(tensorboard_dir, update_freq="epoch", profile_batch=0)]
        if initial_epoch:
            log(f"resuming after epoch {initial_epoch} from {checkpoints.uri}")

    reader = spec_train.get("input") or {}
    reading = {"reader_threads": int(reader.get("readerWorkers", 4)),
               "row_group_cache": int(reader.get("rowGroupCache", 50))}
    train_data, train_reader = make_dataset(dataset, "train", rank=rank, size=size,
                                            batch_size=scaled.batch_size_per_worker, seed=seed, clock=clock,
                                            delay=reader_delay(), **reading)
    val_data, val_reader = make_dataset(dataset, "validation", rank=rank, size=size,
                                        batch_size=scaled.batch_size_per_worker, seed=seed, **reading)
    started = time.monotonic()
    try:
        if initial_epoch < max_epochs:
            model.fit(train_data, steps_per_epoch=scaled.steps_per_epoch, epochs=max_epochs,
                      initial_epoch=initial_epoch, validation_data=val_data, callbacks=callbacks,
                      verbose=0)  # rank 0's EpochReporter prints one line per epoch
    finally:
        for reader in (train_reader, val_reader):
            reader.stop()
            reader.join()

    if rank == 0:
        _upload_tree(tensorboard_dir, run_root.join("tensorboard"))
        model_uri = _save_model(model, run_root.join("model"))
        progress.finish("succeeded", model_uri=model_uri)
        document = progress.document
        if tracker is not None:
            tracker.finish("FINISHED", best_epoch=document["bestEpoch"], best_metrics=document["bestMetrics"],
                           model_uri=model_uri)
        log(f"done in {time.monotonic() - started:.0f} s: best epoch {document['bestEpoch']} "
            f"{document['bestMetrics']}; model {model_uri}")
    return 0


def _probe_batch_size(spec_model: dict[str, Any], dataset, classes: int, weights, spec_train: dict[str, Any],
                      rank: int, size: int, log):
    """batchSizePerWorker: auto. Rank 0 probes a throwaway copy of the model (see probe.py) while the
    others wait; every rank gets its result, or its error."""
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    from .probe import is_out_of_memory, keras_measure, run_probe

    result, error = None, None
    if rank == 0:
        oom_at = os.environ.get(OOM_AT_ENV)
        try:
            model = build_model(spec_model["base"], dataset.image_size, classes, weights,
                                spec_model.get("dropout", 0.0), spec_model.get("trainableBase", False))
            model.compile(optimizer=_optimizer(spec_train["optimizer"], spec_train["baseLearningRate"]),
                          loss="sparse_categorical_crossentropy")
            sizes = candidate_sizes(PROBE_START, probe_ceiling(dataset.rows["train"], size))
            result = run_probe(keras_measure(model, dataset.image_size, classes,
                                             oom_at=int(oom_at) if oom_at else None), sizes, is_out_of_memory)
            log(f"scalingrun-trainer: {result.describe()}")
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or the others wait forever
            error = f"batchSizePerWorker auto: {type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            model = None
            tf.keras.backend.clear_session()  # the probe's model and its memory go before the real one
    result, error = hvd_tf.broadcast_object((result, error), root_rank=0, name="batch_size_probe")
    if error:
        raise ProbeError(error)
    return result


def _combine_input_figures(wait: Optional[float], gpu: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """All ranks: the largest input-wait share (the slowest reader holds every rank back in the allreduce)
    and the mean GPU utilisation over the ranks that have one."""
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    worst = hvd_tf.allreduce(tf.constant([-1.0 if wait is None else wait], tf.float64), op=hvd_tf.Max,
                             name="input_wait_fraction")
    total, count = hvd_tf.allreduce(tf.constant([gpu or 0.0, 0.0 if gpu is None else 1.0], tf.float64),
                                    op=hvd_tf.Sum, name="gpu_utilization").numpy()
    worst = float(worst.numpy()[0])
    return (worst if worst >= 0 else None), (float(total / count) if count else None)


def _run_params(config: dict[str, Any], dataset, scaled, size: int) -> dict[str, Any]:
    """What an MLflow user compares runs by: the spec's choices and the values scaling derived."""
    model, training = config["model"], config["training"]
    stopping = training.get("earlyStopping") or {}
    return {
        "base": model["base"], "weights": model.get("weights", "imagenet"), "dropout": model.get("dropout", 0.0),
        "trainableBase": model.get("trainableBase", False), "imageSize": dataset.image_size,
        "classes": len(dataset.classes), "dataset": dataset.uri, "datasetFingerprint": dataset.fingerprint,
        "trainRows": dataset.rows["train"], "validationRows": dataset.rows["validation"],
        "processes": size, "batchSizePerWorker": scaled.batch_size_per_worker,
        "effectiveBatchSize": scaled.effective_batch_size, "baseLearningRate": training["baseLearningRate"],
        "learningRateScaling": training["learningRateScaling"], "learningRate": scaled.learning_rate,
        "stepsPerEpoch": scaled.steps_per_epoch, "optimizer": training["optimizer"],
        "maxEpochs": training["maxEpochs"], "earlyStopping": stopping.get("enabled", True),
        "earlyStoppingMonitor": stopping.get("monitor", "val_loss"), "earlyStoppingPatience": stopping.get("patience", 3),
    }


def _broadcast_error(error: Optional[str]) -> Optional[str]:
    import horovod.tensorflow as hvd_tf

    return hvd_tf.broadcast_object(error, root_rank=0, name="mlflow_start")


def _upload_tree(local_dir: str, target) -> None:
    """Copies a local folder (TensorBoard event files) to the run location, then removes it."""
    for folder, _, names in os.walk(local_dir):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                target.join(*os.path.relpath(path, local_dir).split(os.sep)).write_bytes_atomic(f.read())
    shutil.rmtree(local_dir, ignore_errors=True)


def _save_model(model, target) -> str:
    """Keras native format, written locally then copied (object stores have no local paths)."""
    workdir = tempfile.mkdtemp(prefix="model-")
    try:
        path = os.path.join(workdir, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            target.join("model.keras").write_bytes_atomic(f.read())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return target.join("model.keras").uri
