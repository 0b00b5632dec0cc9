"""`scalingrun.Run(...).submit(local=True).wait()`: the reduced quick start (200 Fashion-MNIST JPEGs, 96 px, 2 epochs
of batch 16, 2 Horovod processes) trained on this machine through the Python client; the progress it showed, its
metrics, its logs and its status are the local runner's."""

from __future__ import annotations

import re

import pytest

import scalingrun
from scalingrun.display import LineDisplay
from scalingrun_operator.local.quickstart import upload_fashion_mnist
from tests.support.env import ROOT
from tests.support.quickstart import LEARNS, example_spec

pytestmark = [pytest.mark.horovod, pytest.mark.s3]


def test_the_reduced_quickstart_trains_through_the_client(s3_server, tmp_path, monkeypatch, capsys):
    body = example_spec(ROOT / "examples/quickstart.yaml", maxEpochs=2, batchSizePerWorker=16)
    body["metadata"]["name"] = "client-quickstart"
    body["spec"]["storage"]["endpoint"] = s3_server.endpoint
    upload_fashion_mnist(s3_server, body["spec"]["dataset"]["source"], per_class=20)
    for variable, value in {**s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}.items():
        monkeypatch.setenv(variable, value)

    run = scalingrun.Run.from_dict(body).submit(local=True, workdir=tmp_path / "run")
    status = run.wait(timeout=900, display=LineDisplay(run.name))

    assert status["phase"] == "Succeeded" and status["training"]["processes"] == 2
    shown = capsys.readouterr().err.splitlines()
    progress = [line for line in shown if line.startswith("client-quickstart ")]  # the runner's own lines between
    assert progress[:2] == ["client-quickstart Pending", "client-quickstart Preprocessing"], progress
    assert any(line.startswith("client-quickstart Training") for line in progress), progress
    assert re.fullmatch(r"client-quickstart Succeeded: epoch 2/2, \d+ images/s", progress[-1]), progress
    metrics = run.metrics()  # a DataFrame: pandas is in the training venv
    assert list(metrics["epoch"]) == [1, 2] and (metrics["images_per_second"] > 0).all()
    assert metrics["val_accuracy"].max() == pytest.approx(status["training"]["bestMetrics"]["val_accuracy"])
    assert metrics["val_accuracy"].max() >= LEARNS
    assert "val_accuracy" in run.logs(rank=0)
    assert run.status == status  # the finished run's status stays readable
    run.delete()  # a finished local run: nothing to stop
    assert run.phase == "Succeeded"
