"""The engines, one row each: what a (training.framework, training.strategy) pair means to every part that must
agree on it (the MPIJob's slots and environment, a sweep's processes, the default image, validation, the local
runner, the trainer module that runs it and the stack that module imports first). The framework and strategy
names are spelled once, in models/training.py; everything else asks this table.
Adding an engine is a row here plus its trainer package.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

from .heartbeat import DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, engine_timeout_after
from .models.common import DEFAULT_TRAINER_IMAGES, trainer_image_name
from .models.model import BaseNetwork
from .models.training import FRAMEWORK_STRATEGIES, Framework, Strategy

# How a local run starts the ranks: horovodrun -np N -H localhost:N --gloo, or Open MPI's mpirun -np N.
HOROVODRUN, MPIRUN = "horovodrun", "mpirun"


def horovod_stall_env(engine_timeout: Optional[float]) -> dict[str, str]:
    """Horovod's stall check (a warning naming the ranks that did not submit a tensor) and shutdown, and Gloo's
    operation timeout (horovodrun --gloo; 30 s by default), read at hvd.init(): after the trainer's stall watch,
    at `engine_timeout` (heartbeat.engine_timeout_after); {} where the watch is off. A frozen rank blocks Horovod's
    own coordination too (measured: no stall warning in 4 minutes), which is why the watch exists."""
    if not engine_timeout:
        return {}
    return {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(int(min(60, engine_timeout))),
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(int(engine_timeout)),
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(engine_timeout))}


# Every Horovod rank's, our trainer's or a training.command's (set by the MPIJob, and by a local run: Gloo's 30 s
# default failed a rank waiting in a collective behind a peer slowed by a loaded machine): the trainer's at its
# default watch (300 s watch + 60 s roll call + 30 s).
HOROVOD_STALL_ENV = MappingProxyType(horovod_stall_env(engine_timeout_after(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)))


@dataclass(frozen=True)
class Engine:
    framework: str
    strategy: str
    trainer_module: str  # its train(config) runs the engine
    cpu_flavour: str  # its default image without GPUs (spec.workers.image not set): <images>-<flavour>
    gpu_flavour: str  # ... and with spec.workers.gpusPerWorker > 0 (the CUDA build)
    image_words: str  # its images, as an error message names them
    process_per_gpu: bool  # False: one process per worker pod drives all of the pod's GPUs
    stack: tuple[str, ...]  # what the trainer imports first: the image (or venv) lacks one -> the wrong image
    local_launcher: str  # HOROVODRUN or MPIRUN
    own_venv: bool = False  # locally: its ranks run in the framework's own venv (torch), not the operator's
    thread_variable: Optional[str] = None  # set to the pod's CPU / slots (the framework starts one thread per core)
    rank_env: tuple[tuple[str, str], ...] = ()  # set for every rank by the MPIJob (setdefault by the trainer)
    bases: Optional[tuple[str, ...]] = None  # the model.base values it trains; None: every one
    weights_suffixes: Optional[tuple[str, ...]] = None  # model.weights files it reads; None: Keras's

    def image_flavour(self, gpus: int) -> str:
        """The image flavour of a worker with `gpus` GPUs: the devices choose the build, the engine its stack."""
        return self.gpu_flavour if gpus > 0 else self.cpu_flavour

    def default_image(self, gpus: int, images: str = "", digests: Optional[Mapping[str, str]] = None) -> str:
        """The engine's trainer image for `gpus` GPUs per worker under IMAGES ("<repository>:<tag>", the operator's
        setting), else ours; pinned by the flavour's digest in `digests` (the operator's trainerImageDigests)."""
        return trainer_image_name(self.image_flavour(gpus), images or DEFAULT_TRAINER_IMAGES, digests)

    def slots_per_worker(self, gpus_per_worker: int) -> int:
        """MPI slots, = training processes, per worker pod."""
        return max(gpus_per_worker, 1) if self.process_per_gpu else 1


ENGINES: dict[tuple[str, str], Engine] = {
    (engine.framework, engine.strategy): engine for engine in (
        Engine(Framework.keras.value, Strategy.horovod.value, "scalingrun_trainer.engines.keras_horovod.train",
               "cpu", "gpu", "the Keras trainer image", process_per_gpu=True,
               stack=("tensorflow", "horovod.tensorflow.keras"), local_launcher=HOROVODRUN,
               rank_env=tuple(HOROVOD_STALL_ENV.items())),
        Engine(Framework.keras.value, Strategy.multi_worker_mirrored.value, "scalingrun_trainer.engines.keras_mirrored.train",
               "cpu", "gpu", "the Keras trainer image", process_per_gpu=False,
               stack=("tensorflow", "mpi4py"), local_launcher=MPIRUN),
        Engine(Framework.pytorch_lightning.value, Strategy.ddp.value, "scalingrun_trainer.engines.lightning_ddp.train",
               "lightning-cpu", "lightning-gpu", "the Lightning trainer image (-lightning-cpu or -lightning-gpu)",
               process_per_gpu=True,
               stack=("torch", "pytorch_lightning"), local_launcher=MPIRUN, own_venv=True,
               thread_variable="OMP_NUM_THREADS", bases=(BaseNetwork.efficientnet_lite0.value,),
               weights_suffixes=(".pth", ".pt")),
    )
}


# The flavours our scheme marks as built for CPU only, longest first: a tag that is one of them or ends in -<it>.
CPU_FLAVOURS = tuple(sorted({row.cpu_flavour for row in ENGINES.values()}, key=len, reverse=True))


def image_tag(image: str) -> str:
    """The tag of an image reference ("" when it has none: a digest alone, or the implied latest)."""
    repository, _, tag = image.split("@", 1)[0].rpartition(":")
    return tag if repository and "/" not in tag else ""


def cpu_flavour_of(image: str) -> Optional[str]:
    """The CPU flavour our naming scheme reads in `image` (…:0.1.0-cpu, …:0.1.0-lightning-cpu, …:cpu), else None:
    a run asking for GPUs in such an image trains on the CPU. Names outside the scheme are not judged."""
    tag = image_tag(image)
    return next((flavour for flavour in CPU_FLAVOURS if tag == flavour or tag.endswith(f"-{flavour}")), None)


def engine(framework: str, strategy: str) -> Engine:
    """The engine of a validated spec (validation refuses a pair without a row)."""
    return ENGINES[(framework, strategy)]


def framework_engine(framework: str) -> Engine:
    """The engine of `framework`'s default strategy (what the framework's own venv and image are)."""
    return engine(framework, FRAMEWORK_STRATEGIES[framework][0])

