"""The engines, one row each: what a (training.framework, training.strategy) pair means to every part that must
agree on it (the MPIJob's slots, a sweep's processes, the default image, the trainer module that runs it).
Adding an engine is a row here plus its trainer package.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models.common import DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE
from .models.training import Framework, Strategy


@dataclass(frozen=True)
class Engine:
    framework: str
    strategy: str
    trainer_module: str  # its train(config) runs the engine
    default_image: str  # when spec.workers.image is not set
    process_per_gpu: bool  # False: one process per worker pod drives all of the pod's GPUs

    def slots_per_worker(self, gpus_per_worker: int) -> int:
        """MPI slots, = training processes, per worker pod."""
        return max(gpus_per_worker, 1) if self.process_per_gpu else 1


ENGINES: dict[tuple[str, str], Engine] = {
    (engine.framework, engine.strategy): engine for engine in (
        Engine(Framework.keras.value, Strategy.horovod.value, "scalingrun_trainer.engines.keras_horovod.train",
               DEFAULT_TRAINER_IMAGE, process_per_gpu=True),
        Engine(Framework.keras.value, Strategy.multi_worker_mirrored.value, "scalingrun_trainer.engines.keras_mirrored.train",
               DEFAULT_TRAINER_IMAGE, process_per_gpu=False),
        Engine(Framework.pytorch_lightning.value, Strategy.ddp.value, "scalingrun_trainer.engines.lightning_ddp.train",
               DEFAULT_LIGHTNING_TRAINER_IMAGE, process_per_gpu=True),
    )
}


def engine(framework: str, strategy: str) -> Engine:
    """The engine of a validated spec (validation refuses a pair without a row)."""
    return ENGINES[(framework, strategy)]
