"""scalingrun.Run built from keyword arguments, a dict or YAML: one document, checked by validate's rules, its errors
validate's sentences; the progress wait() shows, from the status."""

from __future__ import annotations

import copy
import datetime as dt
import io
import subprocess
import sys

import pytest
import yaml

import scalingrun
from scalingrun.display import LineDisplay, progress_text
from scalingrun_api.models import Training
from tests.support.specs import MINIMAL


def test_keyword_arguments_a_dict_and_yaml_build_the_same_run(tmp_path):
    by_keywords = scalingrun.Run("demo", storage={"credentialsSecret": "s3-creds"},
                                 dataset={"source": "s3://bucket/raw", "output": "s3://bucket/parquet"},
                                 training=Training(max_epochs=3), run_policy={"suspend": True})
    body = copy.deepcopy(MINIMAL)
    body["spec"]["training"] = {"maxEpochs": 3}
    body["spec"]["runPolicy"] = {"suspend": True}
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(body))
    runs = [by_keywords, scalingrun.Run.from_dict(body), scalingrun.Run.from_yaml(path),
            scalingrun.Run.from_yaml(yaml.safe_dump(body))]
    assert {run.model.model_dump_json() for run in runs} == {runs[1].model.model_dump_json()}
    assert by_keywords.model.spec.training.max_epochs == 3 and by_keywords.model.spec.run_policy.suspend is True
    assert yaml.safe_load(by_keywords.to_yaml())["spec"]["runPolicy"] == {"suspend": True}
    assert by_keywords.name == "demo" and runs[2].source == str(path)


def test_an_invalid_run_says_what_validate_says(tmp_path):
    body = copy.deepcopy(MINIMAL)
    body["spec"]["training"] = {"maxEpoch": 3, "batchSizePerWorker": 0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    validate = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "validate", "-f", str(path)],
                              capture_output=True, text=True, timeout=60)
    assert validate.returncode == 1
    with pytest.raises(scalingrun.InvalidRun) as raised:
        scalingrun.Run.from_yaml(path)
    assert str(raised.value) == validate.stderr.strip()
    assert "spec.training.maxEpoch: unknown field; did you mean maxEpochs?" in raised.value.errors
    with pytest.raises(scalingrun.InvalidRun) as raised:
        scalingrun.Run("demo", **body["spec"])
    assert str(raised.value).splitlines()[0] == "<python>: ScalingRun demo is invalid:"
    assert str(raised.value).splitlines()[1:] == validate.stderr.strip().splitlines()[1:]


def test_yaml_that_is_not_one_scalingrun_is_refused_with_the_reason():
    with pytest.raises(scalingrun.InvalidRun, match=r"^<yaml>: expected one ScalingRun, found 2$"):
        scalingrun.Run.from_yaml(yaml.safe_dump_all([MINIMAL, MINIMAL]))
    with pytest.raises(scalingrun.InvalidRun, match=r"^<yaml>: not valid YAML \(line 3, column 1\): expected ','"):
        scalingrun.Run.from_yaml("kind: ScalingRun\nspec: [unclosed\n")
    with pytest.raises(scalingrun.InvalidRun, match=r"^/nonexistent/run.yaml: cannot read: No such file or directory$"):
        scalingrun.Run.from_yaml(__import__("pathlib").Path("/nonexistent/run.yaml"))


def test_a_run_not_submitted_has_no_status_and_says_so():
    run = scalingrun.Run.from_dict(MINIMAL)
    with pytest.raises(scalingrun.RunNotSubmitted, match="ScalingRun demo has not been submitted: call submit"):
        run.status
    with pytest.raises(scalingrun.RunNotSubmitted):
        run.wait()


NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_the_progress_line_has_epochs_images_per_second_and_the_eta_while_training():
    training = {"epoch": 3, "maxEpochs": 10, "imagesPerSecond": 812.4, "estimatedCompletion": "2026-01-01T12:04:10Z"}
    assert progress_text("q", {"phase": "Training", "training": training}, NOW) == \
        "q Training: epoch 3/10, 812 images/s, ETA 4m10s"
    training["estimatedCompletion"] = "2026-01-01T14:30:00Z"
    assert progress_text("q", {"phase": "Training", "training": training}, NOW).endswith("ETA 2h30m")
    assert progress_text("q", {"phase": "Succeeded", "training": training}, NOW) == \
        "q Succeeded: epoch 3/10, 812 images/s"
    assert progress_text("q", {}, NOW) == "q Pending"


def test_the_line_display_prints_a_line_per_change_only():
    stream = io.StringIO()
    display = LineDisplay("q", stream)
    for status in [{}, {}, {"phase": "Preprocessing"}, {"phase": "Preprocessing"},
                   {"phase": "Training", "training": {"epoch": 1, "maxEpochs": 2}}]:
        display.update(status)
    assert stream.getvalue().splitlines() == ["q Pending", "q Preprocessing", "q Training: epoch 1/2"]


def test_horovod_runner_refuses_no_processes_and_a_cluster_run_without_its_run():
    with pytest.raises(ValueError, match="np=0: a negative number of processes"):
        scalingrun.HorovodRunner(np=0)
    with pytest.raises(ValueError, match=r"^HorovodRunner\(np=2\) needs run=: the ScalingRun"):
        scalingrun.HorovodRunner(np=2)


def test_lightning_runner_names_itself_and_refuses_a_cluster_run_without_torch():
    with pytest.raises(ValueError, match=r"^LightningRunner\(np=2\) needs run=: the ScalingRun"):
        scalingrun.LightningRunner(np=2)
    keras = scalingrun.Run.from_dict(copy.deepcopy(MINIMAL))  # the default framework
    with pytest.raises(ValueError, match=r"^LightningRunner\(np=2\) needs a run= of framework pytorch-lightning "
                                         r"\(its image has torch\), not keras$"):
        scalingrun.LightningRunner(np=2, run=keras)
