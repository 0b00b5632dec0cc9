"""scalingrun.LightningRunner(np=-2): a function of this file shipped to two processes under mpirun with the Lightning
venv's python, torch.distributed's world set up on each: an all_reduce and a Lightning DDP fit run with no setup of
their own, rank 0's value comes back, and a rank that raises is named with its traceback; np=2 the same in a
pytorch-lightning ScalingRun through the local runner."""

from __future__ import annotations

import json

import pytest

import scalingrun
from scalingrun_api.progress import PROGRESS_FILE

pytestmark = pytest.mark.lightning


def all_reduce_and_fit() -> dict:
    """The ranks' sum (0 + 1) over torch.distributed, then one epoch of a Lightning DDP fit on random tensors over
    the world the runner set up: each rank's view of it, rank 0's returned."""
    import os

    import pytorch_lightning as pl
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                         num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
                         max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Tiny(), data)
    # DDP keeps the ranks' weights equal: the sum of the weights' sums over the ranks is twice rank 0's.
    weights = torch.tensor([float(sum(p.sum() for p in trainer.lightning_module.parameters()))])
    summed = weights.clone()
    dist.all_reduce(summed)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": float(total),
            "trainer": (trainer.global_rank, trainer.world_size), "steps": trainer.global_step,
            "weights_equal": bool(torch.isclose(summed, 2 * weights))}


def fails_on_rank_1() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank 1 has no data")
    dist.barrier()  # rank 0 waits for rank 1, which never comes: mpirun stops it


def test_two_processes_here_run_in_a_ddp_world_and_return_rank_zeros_value(tmp_path, lightning_python, monkeypatch):
    monkeypatch.setenv("SCALINGRUN_LIGHTNING_PYTHON", lightning_python)
    value = scalingrun.LightningRunner(np=-2, workdir=tmp_path).run(all_reduce_and_fit)
    # 32 rows in batches of 8 split over 2 ranks: 2 steps each.
    assert value == {"rank": 0, "world": 2, "sum": 1.0, "trainer": (0, 2), "steps": 2, "weights_equal": True}


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path, lightning_python, monkeypatch):
    monkeypatch.setenv("SCALINGRUN_LIGHTNING_PYTHON", lightning_python)
    with pytest.raises(scalingrun.LightningRunnerError) as raised:
        scalingrun.LightningRunner(np=-2, workdir=tmp_path, driver_log_verbosity="log_callback_only").run(
            fails_on_rank_1)
    first = str(raised.value).splitlines()[0]
    assert first == "rank 1 of 2 failed: ValueError: rank 1 has no data", str(raised.value)
    assert "in fails_on_rank_1" in str(raised.value)



def all_reduce_of_ranks() -> dict:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": float(total)}


def test_np_above_zero_runs_the_function_in_a_lightning_scalingrun(tmp_path, lightning_python, monkeypatch):
    """LightningRunner(np=2, run=...) through the local runner (what the cluster's pods run, on this machine): the
    run's training.command runs the function from its file:// store with --ddp-world on 2 ranks under mpirun with
    the Lightning venv's python, and rank 0's value comes back from the store."""
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    monkeypatch.setenv("SCALINGRUN_LIGHTNING_PYTHON", lightning_python)
    for name, data in fashion_mnist_jpegs(5, split="train"):
        (tmp_path / "jpeg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "jpeg" / name).write_bytes(data)
    spec = {"dataset": {"imageSize": 32, "preprocessing": {"parallelism": 1}, "source": f"file://{tmp_path}/jpeg",
                        "output": f"file://{tmp_path}/parquet"},
            "training": {"framework": "pytorch-lightning", "batchSizePerWorker": 8},
            "workers": {"gpusPerWorker": 0, "cpu": 1, "memory": "2Gi"}}
    base = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "team"}, "spec": spec}
    runner = scalingrun.LightningRunner(np=2, run=base, local=True, workdir=tmp_path / "run")
    assert runner.run(all_reduce_of_ranks) == {"rank": 0, "world": 2, "sum": 1.0}
    run = runner.last_run
    assert run.model.spec.training.command[-1] == "--ddp-world" and run.status["phase"] == "Succeeded"
    # A function that never used the SDK: rank 0 ended the run's progress document (the operator waits for none).
    progress = json.loads((tmp_path / "parquet" / "runs" / run.name / PROGRESS_FILE).read_text())
    assert progress["state"] == "succeeded" and progress["history"] == [], progress
