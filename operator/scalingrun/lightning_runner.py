"""`scalingrun.LightningRunner(np=...)`: HorovodRunner's shape for a PyTorch function, its DDP world set up. Every
rank runs the shipped function inside torch.distributed's process group (scalingrun_trainer.sdk.lightning_world,
ddp_world: ranks from MPI, as our Lightning trainer's DDP), so the function calls dist.all_reduce, or fits a
Lightning Trainer(strategy="ddp", devices=LOCAL_WORLD_SIZE, num_nodes=...), with no setup of its own.
`np < 0` runs -np processes here under mpirun with the Lightning venv's python (torch lives there, as for
`scalingrun run --local`); `np > 0` a ScalingRun of np workers whose run is a pytorch-lightning one (its image has
torch)."""

from __future__ import annotations

import sys
from typing import Any

from scalingrun_api.models.training import Framework
from scalingrun_api.shipped import WORKER_MODULE
from scalingrun_operator.local.processes import lightning_python, mpirun
from .horovod_runner import HorovodRunner, HorovodRunnerError


class LightningRunnerError(HorovodRunnerError):
    """The function failed on some rank (the message names the rank and ends with its traceback), or the processes
    could not start."""


class LightningRunner(HorovodRunner):
    """`LightningRunner(np=-2).run(train, epochs=1)`: train(epochs=1) on 2 processes here, torch.distributed's world
    of 2 set up on each; rank 0's return value comes back. The arguments are HorovodRunner's."""

    Error = LightningRunnerError
    LAUNCHER = "mpirun"
    WORKER_OPTIONS = ("--ddp-world",)

    def __init__(self, np: int, **arguments: Any):
        super().__init__(np, **arguments)
        framework = self.base and Framework(self.base.model.spec.training.framework)
        if framework not in (None, Framework.pytorch_lightning):
            raise ValueError(f"LightningRunner(np={np}) needs a run= of framework {Framework.pytorch_lightning.value}"
                             f" (its image has torch), not {framework.value}")

    def _command(self, processes: int, folder: str) -> list[str]:
        return [*mpirun(processes), lightning_python(), "-m", WORKER_MODULE, folder, *self.WORKER_OPTIONS]

    def _ranks_path(self) -> list[str]:
        """This process's path but its installed packages: the ranks' venv is the Lightning one, with its own."""
        return [p for p in super()._ranks_path()
                if not {"site-packages", "dist-packages"} & set(p.split("/")) and not p.startswith(sys.base_prefix)]
