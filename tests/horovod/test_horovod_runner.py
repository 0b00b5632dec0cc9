"""scalingrun.HorovodRunner(np=-2): a function of this file shipped (by value) to two Horovod processes here; rank 0's
return value comes back, and a rank that raises is named with its traceback."""

from __future__ import annotations

import json
import os
import re

import pytest

import scalingrun
from scalingrun import function_store
from scalingrun_api.engines import HOROVOD_STALL_ENV
from scalingrun_api.progress import PROGRESS_FILE
from scalingrun_operator.builders.locations import join, run_location
from tests.support.horovodrun import horovodrun
from tests.support.shipped_ranks import each_rank_fails_alone
from tests.support.shipped_training import TEAM_CODE, train_hvd
from tests.support.wheels import write_wheel

pytestmark = pytest.mark.horovod


def allreduce_of_ranks(scale: float) -> dict:
    """Each rank adds rank + 1: the sum over 2 ranks is 3, times `scale`; rank 0 returns it, and its Gloo timeout."""
    import os

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total) * scale,
            "gloo_timeout": os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS")}


def fails_on_rank_1() -> None:
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 has no data")


def needs_a_package_not_installed() -> None:
    import scalingrun_no_such_package  # noqa: F401  (the team's function, run where its package is missing)


def test_two_processes_here_return_rank_zeros_value(tmp_path, monkeypatch):
    horovodrun()  # skips where Horovod is not built
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)
    value = scalingrun.HorovodRunner(np=-2, workdir=tmp_path).run(allreduce_of_ranks, scale=10.0)
    # Gloo's timeout is every Horovod rank's of ours (scalingrun_api.engines), not Gloo's own 30 s.
    assert value == {"rank": 0, "size": 2, "sum": 30.0,
                     "gloo_timeout": HOROVOD_STALL_ENV["HOROVOD_GLOO_TIMEOUT_SECONDS"]}
    # The ranks found the function by digest in the folder it was shipped to, and rank 0 left its value there.
    shipped = next(tmp_path.iterdir())
    assert (shipped / "function.sha256").read_text().startswith("sha256:")
    assert (shipped / "result.pkl").exists()


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path, monkeypatch):
    horovodrun()
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with pytest.raises(scalingrun.HorovodRunnerError) as raised:
        scalingrun.HorovodRunner(np=-2, workdir=tmp_path, driver_log_verbosity="log_callback_only").run(fails_on_rank_1)
    first = str(raised.value).splitlines()[0]
    assert first == "rank 1 of 2 failed: ValueError: rank 1 has no data", str(raised.value)
    assert "in fails_on_rank_1" in str(raised.value)



def test_a_missing_package_fails_the_run_naming_it_on_every_rank(tmp_path, monkeypatch):
    horovodrun()
    missing = "ModuleNotFoundError: No module named 'scalingrun_no_such_package'"
    with pytest.raises(scalingrun.HorovodRunnerError) as raised:
        scalingrun.HorovodRunner(np=-2, workdir=tmp_path, driver_log_verbosity="log_callback_only").run(
            needs_a_package_not_installed)
    # Whichever rank failed first (horovodrun then stops the other) is the one named.
    assert re.fullmatch(rf"rank [01] of 2 failed: {missing}", str(raised.value).splitlines()[0]), str(raised.value)
    # Each rank on its own, as the launcher starts it: it fails naming the package, and leaves its traceback.
    each_rank_fails_alone(next(tmp_path.iterdir()), re.escape(missing))


@pytest.mark.parametrize("store", ["file", "s3"])
def test_np_above_zero_runs_the_function_in_a_scalingrun_from_its_store(store, tmp_path, monkeypatch, request):
    """HorovodRunner(np=2, run=...) through the local runner (what the cluster's pods run, on this machine): the
    function (the articles' train_hvd, its network from the team's module shipped as code_dir) is stored under its
    digest in the run's store (a folder, or SeaweedFS's S3 with keys from the environment), its run's
    training.command runs it on 2 ranks under mpirun, rank 0's value comes
    back from the store, and the epochs it reported through the SDK are the run's status, ended as it returned."""
    from scalingrun_operator.local.quickstart import upload_fashion_mnist
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    horovodrun()
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = {"dataset": {"imageSize": 32, "preprocessing": {"parallelism": 1}}, "training": {"maxEpochs": 2, "batchSizePerWorker": 8},
            "workers": {"gpusPerWorker": 0, "cpu": 1, "memory": "2Gi"}}
    if store == "file":
        for name, data in fashion_mnist_jpegs(5, split="train"):
            (tmp_path / "jpeg" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "jpeg" / name).write_bytes(data)
        location = f"file://{tmp_path}"
    else:
        server = request.getfixturevalue("s3_server")
        location = f"s3://runner-{tmp_path.name.lower().replace('_', '-')[-20:]}"
        upload_fashion_mnist(server, f"{location}/jpeg", per_class=5)
        for variable, value in server.env().items():
            monkeypatch.setenv(variable, value)
        spec["storage"] = {"endpoint": server.endpoint, "credentialsSecret": "team-s3"}
    spec["dataset"].update(source=f"{location}/jpeg", output=f"{location}/parquet")
    base = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": "team"}, "spec": spec}
    # The function's packages come with it: the ranks under mpirun install them, from a wheel folder and no index.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv("SCALINGRUN_PACKAGE_CACHE", str(tmp_path / "packages"))
    packages = [write_wheel(tmp_path / "wheels")]
    runner = scalingrun.HorovodRunner(np=2, run=base, local=True, workdir=tmp_path / "run", packages=packages,
                                      code_dir=TEAM_CODE)
    value = runner.run(train_hvd, learning_rate=0.002)
    assert [json.loads(marker.read_text()) for marker in (tmp_path / "packages").glob("*/scalingrun-packages.json")] \
        == [{"packages": packages}]
    metrics = value.pop("metrics")
    assert value == {"rank": 0, "size": 2, "sum": 3.0, "epochs": 2}
    run = runner.last_run
    training = run.status["training"]
    assert training["epoch"] == 2 and training["processes"] == 2, training
    assert training["metrics"] == pytest.approx({k: metrics[k] for k in training["metrics"]}, abs=1e-5), training
    # Ended as the function returned (in a cluster the operator would otherwise wait out its completion grace).
    progress = function_store.get(run.model, join(run_location(run.model), PROGRESS_FILE))
    assert json.loads(progress)["state"] == "succeeded"
    command = run.model.spec.training.command
    assert command[:3] == ["python", "-m", "scalingrun_trainer.sdk.function"] and command[4] == "--digest"
    digest = command[5]
    assert command[3] == f"{location}/parquet/runs/{run.name}/function/{digest.split(':')[1]}"
    assert training["function"] == {"digest": digest, "location": command[3]}, training
    assert run.name == f"team-fn-{digest.split(':')[1][:10]}" and run.status["phase"] == "Succeeded"
    assert run.model.spec.workers.replicas == 2
