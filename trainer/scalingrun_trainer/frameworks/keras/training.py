"""Data-parallel Keras transfer learning, the same flow under every Keras engine; a `KerasEngine` (engine.py) says
what differs (how the replicas talk, the variables' scope, the optimizer's wrapper, the first callbacks, how a dataset
reaches the replicas, and whether saving is a collective).

core/training.py runs the steps in their order; `KerasTraining` is what Keras does in each (build, restore, fit, save).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from typing import Any, Callable, ContextManager, Optional

from scalingrun_api.config import TrainerConfig
from scalingrun_api.models import AUTO, Devices
from ...core.builder import Builder
from ...core.checkpoints import CheckpointState
from ...core.dataset import validation_rows
from ...core.early_stopping import EarlyStoppingRule
from ...core.input_wait import DelayedBatches, GpuSampler, combine_input_figures, reader_delay
from ...core.probe import ProbeResult
from ...core.progress import EpochRecorder
from ...core.scaling import ScaledRun, scale_auto_run, scale_run
from ...core.session import Attempt, TrainingError, cache_features
from ...core.training import run_training
from .data import make_dataset
from .engine import KerasEngine
from .models import TransferNetwork, build_network, build_user_network, user_classifier


def train(config: TrainerConfig, engine: KerasEngine) -> int:
    attempt = Attempt(config, engine.world, engine=engine.name, trained_on=engine.trained_on())
    attempt.devices = visible_devices()
    code = attempt.run(lambda: run_training(attempt, KerasTraining(attempt, engine)))
    delayed = DelayedBatches.report()  # every rank its own (diagnostic runs only)
    if delayed:
        print(f"scalingrun-trainer: rank {attempt.rank}: {delayed}", flush=True)
    return code


def visible_devices() -> Devices:
    """The GPUs this process trains on as TensorFlow sees them, after the engine pinned them (Horovod: its local
    rank's one; multi-worker-mirrored: its worker's), or CPU."""
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return Devices(kind="cpu", count=0)
    try:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name")
    except (ValueError, RuntimeError):  # a device TensorFlow cannot describe: the kind and count are enough
        name = None
    return Devices(kind="gpu", count=len(gpus), name=name)


def _optimizer(name: str, learning_rate: float):
    import tensorflow as tf

    # Legacy Keras optimizers: the ones Horovod 0.28's DistributedOptimizer wraps reliably on TF 2.15 (and the same
    # under a tf.distribute strategy, so that both engines train the same way).
    optimizers = {
        "nadam": lambda: tf.keras.optimizers.legacy.Nadam(learning_rate),
        "adam": lambda: tf.keras.optimizers.legacy.Adam(learning_rate),
        "sgd": lambda: tf.keras.optimizers.legacy.SGD(learning_rate, momentum=0.9),
    }
    if name not in optimizers:
        raise TrainingError(f"unknown optimizer {name!r}")
    return optimizers[name]()


def _scaled(attempt: Attempt, engine: KerasEngine, weights: Optional[str]) -> tuple[ScaledRun, Optional[ProbeResult]]:
    """Batch size, learning rate and steps for this run; with batchSizePerWorker auto, after the probe (or the one
    the checkpoint was trained with: a resumed training keeps its batch size, and so its learning rate)."""
    import tensorflow as tf

    from .probe import probe_batch_size

    config, training, state = attempt.config, attempt.config.training, attempt.state
    train_rows = attempt.dataset.rows["train"]
    spec_replicas = engine.spec_replicas(config.processes)
    if training.batch_size_per_worker != AUTO:
        scaled = scale_run(train_rows, training.batch_size_per_worker, training.base_learning_rate,
                           training.learning_rate_scaling, engine.replicas, spec_replicas)
        return (scaled if engine.accumulates else scaled.folded()), None
    if state and (state.batch_size_probe or {}).get("chosen"):
        probe = ProbeResult.from_document(state.batch_size_probe)
        attempt.log(f"scalingrun-trainer: batch size {probe.chosen} from the probe before the checkpoint")
    else:
        def probe_model():
            # The whole network, also when the head trains on cached features: the batch size (and so the learning
            # rate) stays what it would be without the cache, and the base's forward pass that fills it fits.
            model = _build(attempt, weights).model
            model.compile(optimizer=_optimizer(training.optimizer, training.base_learning_rate),
                          loss="sparse_categorical_crossentropy")
            return model

        probe = probe_batch_size(attempt, probe_model, engine.replicas)
        tf.keras.utils.set_random_seed(config.dataset.seed)  # rank 0's probe drew numbers the other ranks did not
    scaled = scale_auto_run(train_rows, probe.chosen, training.base_learning_rate, training.learning_rate_scaling,
                            engine.replicas, spec_replicas)
    return (scaled if engine.accumulates else scaled.folded()), probe


def _build(attempt: Attempt, weights: Optional[str]) -> TransferNetwork:
    """The classifier to train, uint8 pixels in and probabilities out: the base and head, or the user's network
    (no halves: a builder's network has no frozen base to cache, core/feature_cache.py)."""
    model, image_size = attempt.config.model, attempt.dataset.image_size
    if model.builder:
        network = build_user_network(Builder.of(model, attempt.config.image), image_size, attempt.classes)
        return TransferNetwork(model=user_classifier(network, image_size), features=None, head=None)
    return build_network(model.base, image_size, attempt.classes, weights, model.dropout, model.trainable_base)


class KerasTraining:
    """core.training's TrainingFramework for Keras under a KerasEngine: build, restore, fit and save."""

    def __init__(self, attempt: Attempt, engine: KerasEngine):
        self.attempt, self.engine = attempt, engine
        self.network: Optional[TransferNetwork] = None
        self.trained = self.checkpoint = self.clock = None  # trained: the model fit runs on
        self.callbacks: list = []
        self.tensorboard_dir: Optional[str] = None

    def prepare(self) -> None:
        import tensorflow as tf

        tf.keras.utils.set_random_seed(self.attempt.config.dataset.seed)  # same initial head on every rank

    def check_network(self) -> None:
        import tensorflow as tf

        if self.attempt.config.model.builder:
            # The user's network is checked before anything else (core/builder.py); every rank fails alike.
            _build(self.attempt, None)
            tf.keras.backend.clear_session()

    def scale(self, weights: Optional[str]) -> tuple[ScaledRun, Optional[ProbeResult]]:
        return _scaled(self.attempt, self.engine, weights)

    def heading(self, scaled: ScaledRun) -> str:
        return f"scalingrun-trainer: {scaled.describe(self.engine.replicas_word)}"

    def run_params(self) -> dict[str, Any]:
        return self.engine.run_params()

    def scope(self) -> ContextManager:
        return self.engine.scope()

    def build(self, scaled: ScaledRun, weights: Optional[str]) -> None:
        import tensorflow as tf

        training = self.attempt.config.training
        self.network = network = _build(self.attempt, weights)
        # With the feature cache the head alone trains (its layers are the model's); the model is saved.
        self.trained = network.head if self.attempt.caches_features else network.model
        optimizer = self.engine.distributed_optimizer(_optimizer(training.optimizer, scaled.learning_rate),
                                                      scaled.accumulation)
        for compiled in {id(network.model): network.model, id(self.trained): self.trained}.values():
            compiled.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        self.checkpoint = tf.train.Checkpoint(model=network.model, optimizer=optimizer)

    def restore(self, state: CheckpointState) -> Any:
        """Every rank restores (a rank-0-only restore leaves the ranks with different optimizer variables and the
        first broadcast waits forever); rank 0's values are then broadcast as on a fresh start."""
        from .callbacks import restore

        return restore(self.attempt.checkpoints, state, self.checkpoint)

    def early_stopping(self, rule: EarlyStoppingRule, restore_best_weights: bool):
        from .callbacks import ResumableEarlyStopping

        return ResumableEarlyStopping(rule, restore_best_weights, verbose=1 if self.attempt.rank == 0 else 0)

    def prepare_fit(self, scaled: ScaledRun, early_stopping, recorder: Optional[EpochRecorder],
                    history: Callable[[], list[dict]], probe: Optional[dict]) -> None:
        """The engine's callbacks first (Horovod: broadcast rank 0's initial variables, average the metrics), then
        the input-wait meter, then early stopping, so that every rank stops on the same epoch from the same
        metrics; then rank 0's report, the checkpoints, TensorBoard and the heartbeat."""
        import tensorflow as tf

        from .callbacks import Checkpointer, EpochReporter, Heartbeat, InputWaitMeter, PreemptionCheck, StepPosition
        from .input_clock import InputClock

        attempt, engine, rank = self.attempt, self.engine, self.attempt.rank
        # Keras counts micro-batches; checkpoints count updates (the same at every world size: core/scaling.py).
        micro_steps, accumulation = scaled.micro_steps_per_epoch, scaled.accumulation
        position = StepPosition(attempt.initial_epoch, attempt.initial_step * accumulation)
        self.clock = InputClock()
        gpu = GpuSampler.open(engine.local_rank) if tf.config.list_physical_devices("GPU") else None
        input_meter = InputWaitMeter(self.clock, gpu,
                                     combine=lambda wait, busy: combine_input_figures(engine.world, wait, busy))
        callbacks: list = [*engine.first_callbacks(), input_meter]
        if early_stopping is not None:
            callbacks.append(early_stopping)
        if recorder is not None:
            callbacks.append(EpochReporter(recorder, scaled.steps_per_epoch * scaled.effective_batch_size,
                                           early_stopping, input_meter,
                                           lambda epoch: position.skipped(epoch) * scaled.rows_per_micro_step))
        checkpointer = None
        if rank == 0 or engine.every_rank_saves:
            checkpointer = Checkpointer(attempt.checkpoints, self.checkpoint,
                                        attempt.config.training.checkpoint.every_epochs, early_stopping, history,
                                        attempt.resume_facts(batch_size_probe=probe))
            callbacks.append(checkpointer)
        if rank == 0:
            self.tensorboard_dir = tempfile.mkdtemp(prefix="tensorboard-")
            callbacks.append(tf.keras.callbacks.TensorBoard(self.tensorboard_dir, update_freq="epoch", profile_batch=0))
        callbacks.append(Heartbeat(attempt.heartbeat, micro_steps, attempt.watch_peers(), position))
        # Last: a stop on a preemption notice comes after this step's beat and records.
        callbacks.append(PreemptionCheck(attempt.notice, engine.world, micro_steps, checkpointer, position,
                                         accumulation))
        self.callbacks = callbacks

    def fit(self, scaled: ScaledRun) -> None:
        attempt, training = self.attempt, self.attempt.config.training
        validation_steps = self.engine.validation_steps(lambda: math.ceil(validation_rows(
            attempt.dataset, shard=attempt.rank, shards=attempt.size, seed=attempt.config.dataset.seed)
            / scaled.batch_size_per_worker))
        epoch, step = attempt.initial_epoch, attempt.initial_step * scaled.accumulation
        micro_steps = scaled.micro_steps_per_epoch
        with _inputs(attempt, self.engine, self.network, scaled, self.clock) as (train_from, val_data):
            def fit(first_epoch: int, first_step: int, epochs: int, steps: int):
                # A fit from a step inside an epoch takes that epoch's rest only (count): nothing drawn beyond it.
                data = train_from(first_epoch, first_step, steps if first_step else None)
                self.trained.fit(data, steps_per_epoch=steps, epochs=epochs, initial_epoch=first_epoch,
                                 validation_data=val_data, validation_steps=validation_steps,
                                 callbacks=self.callbacks, verbose=0)  # rank 0's EpochReporter prints each epoch

            if step:
                # A checkpoint inside an epoch: Keras' epochs all have steps_per_epoch steps, so the rest of this one
                # is a fit of its own, whose end is not the training's (early stopping and the checkpointer hold).
                held = [c for c in self.callbacks if hasattr(c, "train_end_held")]
                for callback in held:
                    callback.train_end_held = True
                try:
                    fit(epoch, step, epoch + 1, micro_steps - step)
                finally:
                    for callback in held:
                        callback.train_end_held = False
                epoch, step = epoch + 1, 0
                if self.trained.stop_training or epoch >= training.max_epochs:
                    for callback in held:
                        callback.on_train_end()
                    return
            fit(epoch, 0, training.max_epochs, micro_steps)

    def save(self) -> Optional[str]:
        rank = self.attempt.rank
        if self.tensorboard_dir is not None:
            _upload_tree(self.tensorboard_dir, self.attempt.run_root.join("tensorboard"))
        if rank == 0 or self.engine.every_rank_saves:
            model_uri = _save_model(self.network.model, self.attempt.run_root.join("model"), commit=rank == 0)
            return model_uri if rank == 0 else None
        return None


@contextlib.contextmanager
def _inputs(attempt: Attempt, engine: KerasEngine, network: TransferNetwork, scaled: ScaledRun, clock):
    """(train_from, validation): `train_from(epoch, step, count)` the training data from that step of that epoch on
    (`count` batches, or endless for None), and the validation data, as the trained model takes them: Petastorm readers of pixels, or this rank's cached features
    (built here, every rank). Cached features start exactly there (their order is a function of the epoch); the
    reader's endless stream has no replayable order, so it goes on where it is (a resumed epoch's steps are
    counted, its rows not replayed)."""
    from . import feature_cache

    batch_size, delay = scaled.batch_size_per_worker, reader_delay()
    if attempt.caches_features:
        extract = feature_cache.extractor(network.features, attempt.dataset.image_size, engine.local_forward)
        cache = cache_features(attempt, extract, batch_size,
                               None if engine.variables_start_equal else feature_cache.ModelWeights(network.model))
        try:
            yield (lambda epoch, step, count: engine.distribute(lambda: feature_cache.train_dataset(
                       cache, first_epoch=epoch, first_step=step, count=count, steps=scaled.micro_steps_per_epoch,
                       batch_size=batch_size, clock=clock, delay=delay)),
                   engine.distribute(lambda: feature_cache.validation_dataset(cache, batch_size=batch_size)))
        finally:
            cache.close()
        return
    input_spec = attempt.config.training.input
    reading = {"reader_threads": input_spec.reader_workers, "row_group_cache": input_spec.row_group_cache}
    readers: list = []

    def reader_of(split: str, **options):
        def make():
            data, reader = make_dataset(attempt.dataset, split, rank=attempt.rank, size=attempt.size,
                                        batch_size=batch_size, seed=attempt.config.dataset.seed, **reading, **options)
            readers.append(reader)
            return data

        return make

    try:
        train = engine.distribute(reader_of("train", clock=clock, delay=delay))
        yield (lambda epoch, step, count: train), engine.distribute(reader_of("validation"))
    finally:
        for reader in readers:
            reader.stop()
            reader.join()


def _upload_tree(local_dir: str, target) -> None:
    """Copies a local folder (TensorBoard event files) to the run location, then removes it."""
    for folder, _, names in os.walk(local_dir):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                target.join(*os.path.relpath(path, local_dir).split(os.sep)).write_bytes_atomic(f.read())
    shutil.rmtree(local_dir, ignore_errors=True)


def _save_model(model, target, commit: bool = True) -> str:
    """Keras native format, written locally then copied (object stores have no local paths); a rank that does not
    commit (saving is a collective under some engines) removes its copy."""
    workdir = tempfile.mkdtemp(prefix="model-")
    try:
        path = os.path.join(workdir, "model.keras")
        model.save(path)
        if commit:
            with open(path, "rb") as f:
                target.join("model.keras").write_bytes_atomic(f.read())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return target.join("model.keras").uri
