"""`scalingrun.Run(...).submit(local=True).wait()`: the reduced quick start (200 Fashion-MNIST JPEGs, 96 px, 2 epochs
of batch 16, 2 Horovod processes) trained on this machine through the Python client; the progress it showed, its
metrics, its logs and its status are the local runner's."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from PIL import Image

import scalingrun
from scalingrun.backends import RunDeleted
from scalingrun.display import LineDisplay
from scalingrun_operator.local.quickstart import upload_fashion_mnist
from tests.support.env import ROOT
from tests.support.quickstart import LEARNS, example_spec

pytestmark = [pytest.mark.horovod, pytest.mark.s3]


def quickstart_run(s3_server, monkeypatch, name: str, epochs: int) -> dict:
    """The reduced quick start's run `name` of `epochs` epochs on the test's S3, its 200 images uploaded and the
    store's credentials set in this process's environment."""
    body = example_spec(ROOT / "examples/quickstart.yaml", maxEpochs=epochs, batchSizePerWorker=16)
    body["metadata"]["name"] = name
    body["spec"]["storage"]["endpoint"] = s3_server.endpoint
    upload_fashion_mnist(s3_server, body["spec"]["dataset"]["source"], per_class=20)
    for variable, value in {**s3_server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}.items():
        monkeypatch.setenv(variable, value)
    return body


def test_the_reduced_quickstart_trains_through_the_client(s3_server, tmp_path, monkeypatch, capsys):
    body = quickstart_run(s3_server, monkeypatch, "client-quickstart", epochs=2)
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
    png, markdown = run.report(tmp_path / "report")
    with Image.open(png) as image:
        image.verify()
        assert image.format == "PNG"
    text = markdown.read_text()
    assert "State: **succeeded** after 2 of 2 epochs." in text and "\n| 1 | " in text, text  # the epochs' table
    run.delete()  # a finished local run: nothing to stop; gone as a deleted cluster run is
    with pytest.raises(RunDeleted):
        run.status
    assert json.loads((tmp_path / "run" / "status.json").read_text())["phase"] == "Succeeded"


def test_delete_stops_a_local_run_while_it_trains(s3_server, tmp_path, monkeypatch):
    body = quickstart_run(s3_server, monkeypatch, "client-deleted", epochs=50)
    workdir = tmp_path / "run"
    run = scalingrun.Run.from_dict(body).submit(local=True, workdir=workdir)
    deadline = time.monotonic() + 600
    while run.phase != "Training" and time.monotonic() < deadline and not run.backend.finished():
        time.sleep(1)
    assert run.phase == "Training", run.status
    run.delete()
    assert run.backend.finished()
    with pytest.raises(RunDeleted, match="^ScalingRun client-deleted was deleted; "):
        run.status
    with pytest.raises(RunDeleted):
        run.wait(progress=False)
    # Its last status is the one it had when deleted, not a verdict on the launcher delete() stopped.
    assert json.loads((workdir / "status.json").read_text())["phase"] == "Training"
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(workdir) not in left  # horovodrun and the ranks are gone
    run.delete()  # again: nothing to do
