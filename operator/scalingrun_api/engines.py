"""The engines, one row each: what a (training.framework, training.strategy) pair means to every part that must
agree on it (the MPIJob's slots, a sweep's processes, the default image, the trainer module that runs it).
Adding an engine is a row here plus its trainer package.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models.common import DEFAULT_TRAINER_IMAGES, trainer_image_name
from .models.training import Framework, Strategy


@dataclass(frozen=True)
class Engine:
    framework: str
    strategy: str
    trainer_module: str  # its train(config) runs the engine
    image_flavour: str  # its default image, when spec.workers.image is not set: <images>-<flavour>
    process_per_gpu: bool  # False: one process per worker pod drives all of the pod's GPUs

    def default_image(self, images: str = "") -> str:
        """The engine's trainer image under IMAGES ("<repository>:<tag>", the operator's setting), else ours."""
        return trainer_image_name(self.image_flavour, images or DEFAULT_TRAINER_IMAGES)

    def slots_per_worker(self, gpus_per_worker: int) -> int:
        """MPI slots, = training processes, per worker pod."""
        return max(gpus_per_worker, 1) if self.process_per_gpu else 1


ENGINES: dict[tuple[str, str], Engine] = {
    (engine.framework, engine.strategy): engine for engine in (
        Engine(Framework.keras.value, Strategy.horovod.value, "scalingrun_trainer.keras_horovod.train",
               "cpu", process_per_gpu=True),
        Engine(Framework.keras.value, Strategy.multi_worker_mirrored.value, "scalingrun_trainer.keras_mirrored.train",
               "cpu", process_per_gpu=False),
        Engine(Framework.pytorch_lightning.value, Strategy.ddp.value, "scalingrun_trainer.lightning.train",
               "lightning-cpu", process_per_gpu=True),
    )
}


def engine(framework: str, strategy: str) -> Engine:
    """The engine of a validated spec (validation refuses a pair without a row)."""
    return ENGINES[(framework, strategy)]
