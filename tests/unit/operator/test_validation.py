"""`scalingrun validate` rules: every bad input is rejected with a message naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from scalingrun_api.models import ScalingRun
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from scalingrun_operator.cli import main
from tests.support.specs import MINIMAL

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("**/*.yaml"))



def with_value(path: str, value) -> dict:
    """MINIMAL with the dotted path set to value (a value of ... deletes the key)."""
    doc = copy.deepcopy(MINIMAL)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return doc


def test_minimal_run_gets_documented_defaults():
    run = parse_scalingrun(MINIMAL)
    assert run.spec.dataset.image_size == 299
    assert run.spec.dataset.validation_fraction == 0.1
    assert run.spec.dataset.sample_fraction == 1.0
    assert run.spec.dataset.seed == 42
    assert run.spec.model.base == "efficientnet_lite0"
    assert run.spec.model.trainable_base is False
    assert run.spec.training.learning_rate_scaling == "linear"
    assert run.spec.training.early_stopping.restore_best_weights is True
    assert run.spec.run_policy.clean_pod_policy == "Running"
    # The launcher only runs mpirun: small enough to fit beside 2 workers on a 2-core node.
    assert (run.spec.launcher.resources.cpu, run.spec.launcher.resources.memory) == ("100m", "256Mi")


def test_batch_size_per_worker_takes_a_number_or_auto():
    assert parse_scalingrun(MINIMAL).spec.training.batch_size_per_worker == 32
    assert parse_scalingrun(with_value("spec.training.batchSizePerWorker", "auto")).spec.training.batch_size_per_worker == "auto"
    assert parse_scalingrun(with_value("spec.training.batchSizePerWorker", 65536)).spec.training.batch_size_per_worker == 65536
    input_pipeline = parse_scalingrun(MINIMAL).spec.training.input
    assert (input_pipeline.reader_workers, input_pipeline.row_group_cache) == (4, 50)


def test_launcher_resources_default_field_by_field():
    resources = parse_scalingrun(with_value("spec.launcher", {"resources": {"cpu": 1}})).spec.launcher.resources
    assert (resources.cpu, resources.memory) == ("1", "256Mi")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_are_valid(example):
    for doc in yaml.safe_load_all(example.read_text()):
        if doc["kind"] == "ScalingSweep":
            from scalingrun_operator.schema.validation import parse_scalingsweep

            assert parse_scalingsweep(doc).spec.workers
            continue
        assert isinstance(parse_scalingrun(doc), ScalingRun)


BAD_INPUTS = [
    # (dotted path set, value, field named in the message, words in the message)
    ("spec.training.batchSizePerWorker", 0, "spec.training.batchSizePerWorker", "greater than or equal to 1"),
    ("spec.training.batchSizePerWorker", -8, "spec.training.batchSizePerWorker", "greater than or equal to 1"),
    ("spec.training.batchSizePerWorker", "big", "spec.training.batchSizePerWorker", "valid integer"),
    ("spec.training.batchSizePerWorker", "32", "spec.training.batchSizePerWorker", 'valid integer >= 1 or "auto"'),
    ("spec.training.batchSizePerWorker", "Auto", "spec.training.batchSizePerWorker", 'or "auto"'),
    ("spec.training.batchSizePerWorker", True, "spec.training.batchSizePerWorker", "valid integer"),
    ("spec.training.batchSizePerWorker", 65537, "spec.training.batchSizePerWorker", "at most 65536"),
    ("spec.training.input.readerWorkers", 0, "spec.training.input.readerWorkers", "greater than or equal to 1"),
    ("spec.training.input.rowGroupCache", 0, "spec.training.input.rowGroupCache", "greater than or equal to 1"),
    ("spec.training.baseLearningRate", 0, "spec.training.baseLearningRate", "greater than 0"),
    ("spec.training.optimizer", "adagrad", "spec.training.optimizer", "'nadam', 'adam' or 'sgd'"),
    ("spec.training.learningRateScaling", "cubic", "spec.training.learningRateScaling", "linear"),
    ("spec.training.maxEpochs", 0, "spec.training.maxEpochs", "greater than or equal to 1"),
    ("spec.training.earlyStopping.patience", -1, "spec.training.earlyStopping.patience", "greater than or equal to 0"),
    ("spec.training.earlyStopping.monitor", "f1", "spec.training.earlyStopping.monitor", "val_loss"),
    ("spec.training.earlyStopping.minDelta", -0.1, "spec.training.earlyStopping.minDelta", "greater than or equal to 0"),
    ("spec.training.checkpoint.everyEpochs", 0, "spec.training.checkpoint.everyEpochs", "greater than or equal to 1"),
    ("spec.training.checkpoint.location", "ftp://x/y", "spec.training.checkpoint.location", "s3://bucket/path"),
    ("spec.training.resume", "maybe", "spec.training.resume", "valid boolean"),
    ("spec.dataset.validationFraction", 0, "spec.dataset.validationFraction", "greater than 0"),
    ("spec.dataset.validationFraction", 1, "spec.dataset.validationFraction", "less than 1"),
    ("spec.dataset.validationFraction", 1.5, "spec.dataset.validationFraction", "less than 1"),
    ("spec.dataset.sampleFraction", 0, "spec.dataset.sampleFraction", "greater than 0"),
    ("spec.dataset.sampleFraction", 1.01, "spec.dataset.sampleFraction", "less than or equal to 1"),
    ("spec.dataset.imageSize", 16, "spec.dataset.imageSize", "greater than or equal to 32"),
    ("spec.dataset.imageSize", 5000, "spec.dataset.imageSize", "less than or equal to 1024"),
    ("spec.dataset.seed", -1, "spec.dataset.seed", "greater than or equal to 0"),
    ("spec.dataset.source", "bucket/raw", "spec.dataset.source", "s3://bucket/path"),
    ("spec.dataset.source", ..., "spec.dataset.source", "required field is missing"),
    ("spec.dataset.output", "http://x/y", "spec.dataset.output", "s3://bucket/path"),
    ("spec.dataset.preprocessing.parallelism", 0, "spec.dataset.preprocessing.parallelism", "greater than or equal to 1"),
    ("spec.dataset.preprocessing.maxBadFraction", 2, "spec.dataset.preprocessing.maxBadFraction", "less than or equal to 1"),
    ("spec.dataset.preprocessing.resources.memory", "lots", "spec.dataset.preprocessing.resources.memory", "positive quantity such as 500m"),
    ("spec.model.base", "resnet9000", "spec.model.base", "efficientnet_lite0"),
    ("spec.model.weights", "imagenet21k", "spec.model.weights", "must be imagenet, none"),
    ("spec.model.dropout", 1.0, "spec.model.dropout", "less than 1"),
    ("spec.model.numClasses", 1, "spec.model.numClasses", "greater than or equal to 2"),
    ("spec.workers.replicas", 0, "spec.workers.replicas", "greater than or equal to 1"),
    ("spec.workers.gpusPerWorker", -1, "spec.workers.gpusPerWorker", "greater than or equal to 0"),
    ("spec.workers.cpu", "four", "spec.workers.cpu", "positive quantity such as 500m"),
    ("spec.launcher.resources", {"cpu": "lots"}, "spec.launcher.resources.cpu", "positive quantity such as 500m"),
    ("spec.launcher.resources", {"gpu": 1}, "spec.launcher.resources.gpu", "unknown field"),
    ("spec.workers.nodeSelector", {"gpu": 1}, "spec.workers.nodeSelector.gpu", "valid string"),
    ("spec.workers.tolerations", [{"effect": "Sometimes"}], "spec.workers.tolerations[0].effect", "NoSchedule"),
    ("spec.runPolicy.cleanPodPolicy", "Some", "spec.runPolicy.cleanPodPolicy", "'None', 'Running' or 'All'"),
    ("spec.runPolicy.backoffLimit", -1, "spec.runPolicy.backoffLimit", "greater than or equal to 0"),
    ("spec.runPolicy.activeDeadlineSeconds", 0, "spec.runPolicy.activeDeadlineSeconds", "greater than or equal to 1"),
    ("spec.runPolicy.schedulingPolicy", {"minAvailable": 0}, "spec.runPolicy.schedulingPolicy.minAvailable", "greater than or equal to 1"),
    ("spec.storage.endpoint", "minio:9000", "spec.storage.endpoint", "http:// or https:// URL"),
    ("spec.storage.credentialsSecret", "Bad_Name", "spec.storage.credentialsSecret", "must be a Kubernetes name"),
    ("spec.storage.accessKey", "AKIA...", "spec.storage.accessKey", "unknown field"),
    ("spec.training.batchsize", 64, "spec.training.batchsize", "unknown field"),
    ("spec.tracking", {"mlflowTrackingUri": "mlflow:5000"}, "spec.tracking.mlflowTrackingUri", "http:// or https:// URL"),
    ("spec.tracking", {"mlflowTrackingUri": "file:///mlruns"}, "spec.tracking.mlflowTrackingUri", "http:// or https:// URL"),
    ("spec.tracking", {"experimentName": "x"}, "spec.tracking.mlflowTrackingUri", "required field is missing"),
    ("spec.tracking", {"mlflowTrackingUri": "http://mlflow:5000", "credentialsSecret": "Bad_Name"},
     "spec.tracking.credentialsSecret", "must be a Kubernetes name"),
    ("spec.tracking", {"mlflowTrackingUri": "http://mlflow:5000", "token": "t0k"}, "spec.tracking.token", "unknown field"),
    ("metadata.name", "Bad_Name", "metadata.name", "match pattern"),
    ("metadata.name", "x" * 41, "metadata.name", "at most 40 characters"),
    ("apiVersion", "scalingrun.dev/v2", "apiVersion", "scalingrun.dev/v1alpha1"),
    ("kind", "Run", "kind", "ScalingRun"),
    ("spec.dataset", ..., "spec.dataset", "required field is missing"),
    # strict types, as the API server has them: no coercion of strings, no fractions for integers
    ("spec.model.trainableBase", "yes", "spec.model.trainableBase", "valid boolean"),
    ("spec.training.resume", 1, "spec.training.resume", "valid boolean"),
    ("spec.workers.replicas", "4", "spec.workers.replicas", "valid integer"),
    ("spec.workers.replicas", 2.5, "spec.workers.replicas", "valid integer"),
    ("spec.model.dropout", "0.5", "spec.model.dropout", "valid number"),
    ("spec.workers.image", 5, "spec.workers.image", "valid string"),
    ("spec.workers.tolerations", [{"key": ""}], "spec.workers.tolerations[0].key", "must not be empty"),
    # names that become Kubernetes names or label values
    ("spec.workers.priorityClassName", "High_Priority", "spec.workers.priorityClassName", "must be a Kubernetes name"),
    ("spec.runPolicy.kueueQueueName", "q" * 64, "spec.runPolicy.kueueQueueName", "at most 63 characters"),
    # quantities are positive
    ("spec.workers.cpu", 0, "spec.workers.cpu", "positive quantity such as 500m"),
    ("spec.workers.cpu", -2, "spec.workers.cpu", "positive quantity such as 500m"),
    ("spec.workers.memory", "0Gi", "spec.workers.memory", "positive quantity such as 500m"),
    ("spec.launcher.resources", {"cpu": "0m"}, "spec.launcher.resources.cpu", "positive quantity such as 500m"),
    ("spec.workers.cpu", 0.5, "spec.workers.cpu", 'write "500m" (a quantity string), not the number 0.5'),
    # cross-field rules the CRD schema cannot express
    ("spec.storage.credentialsSecret", ..., "spec.storage.credentialsSecret", "s3:// is used by spec.dataset.source"),
    ("spec.dataset.output", "s3://bucket/raw/parquet", "spec.dataset.output", "must not be inside spec.dataset.source"),
    ("spec.runPolicy.schedulingPolicy", {"minAvailable": 5}, "spec.runPolicy.schedulingPolicy.minAvailable", "must be <= 2"),
    ("spec.training.earlyStopping", {"monitor": "val_accuracy", "stoppingThreshold": 80},
     "spec.training.earlyStopping.stoppingThreshold", "must be in (0, 1]"),
]


@pytest.mark.parametrize("path,value,field,words", BAD_INPUTS, ids=[f"{b[0]}={b[1]!r}"[:60] for b in BAD_INPUTS])
def test_bad_input_names_the_field(path, value, field, words):
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(with_value(path, value))
    messages = [str(e) for e in caught.value.errors]
    assert any(m.startswith(f"{field}: ") and words in m for m in messages), messages


def test_values_read_as_the_api_server_reads_them():
    """JSON has one number type: 2.0 is the integer 2 to the API server; a null field takes its default."""
    doc = with_value("spec.workers", {"replicas": 2.0, "cpu": 4.0, "memory": "0.5Gi", "image": None})
    doc["spec"]["model"] = {"dropout": 0, "trainableBase": None}
    run = parse_scalingrun(doc)
    assert (run.spec.workers.replicas, run.spec.workers.cpu, run.spec.workers.memory) == (2, "4", "0.5Gi")
    assert run.spec.workers.image is None and run.spec.model.trainable_base is False  # null: the framework's image
    assert run.spec.model.dropout == 0.0


def test_a_whole_float_from_2_to_the_53_is_a_float_as_to_the_api_server():
    """Found by the Hypothesis parity test: `cpu: 2.5e16` was an integer quantity to validate and a "number"
    (neither integer nor string) to the API server."""
    assert parse_scalingrun(with_value("spec.workers.cpu", float(2**53 - 1))).spec.workers.cpu == str(2**53 - 1)
    for path in ("spec.workers.cpu", "spec.launcher.resources.memory"):
        with pytest.raises(InvalidScalingRun) as caught:
            parse_scalingrun(with_value(path, 2.5449075234664388e16))
        assert [e.path for e in caught.value.errors] == [path], caught.value.errors


def test_every_bad_field_is_reported_at_once():
    doc = with_value("spec.training.batchSizePerWorker", 0)
    doc["spec"]["workers"] = {"replicas": 0}
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(doc)
    paths = {e.path for e in caught.value.errors}
    assert {"spec.training.batchSizePerWorker", "spec.workers.replicas"} <= paths


def test_local_paths_need_no_credentials():
    doc = with_value("spec.storage", {})
    doc["spec"]["dataset"] = {"source": "/data/raw", "output": "file:///data/parquet"}
    assert parse_scalingrun(doc).spec.storage.credentials_secret is None


def test_cli_validate_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(MINIMAL))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_value("spec.training.batchSizePerWorker", 0)))
    assert main(["validate", "-f", str(good)]) == 0
    assert "is valid" in capsys.readouterr().out
    assert main(["validate", "-f", str(good), "-f", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "spec.training.batchSizePerWorker" in err and "demo is invalid" in err


def test_cli_validate_unreadable_file(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    assert main(["validate", "-f", str(broken)]) == 1
    assert "broken.yaml: not valid YAML (line 1, column 16)" in capsys.readouterr().err
    assert main(["validate", "-f", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml: no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("quantity, value", [("500m", 0.5), ("2", 2.0), (3, 3.0), ("1.5", 1.5), ("1k", 1000.0),
                                             ("16Gi", 16 * 2.0 ** 30), ("250M", 250e6),
                                             ("24581684Ki", 24581684 * 1024.0)])  # a node's memory, as kubelets say it
def test_quantities_compare_as_numbers(quantity, value):
    from scalingrun_api.models import quantity_value

    assert quantity_value(quantity) == pytest.approx(value)


def test_a_cpu_limit_compares_with_the_request_across_units():
    ok = parse_scalingrun(with_value("spec.workers", {"cpu": "1500m", "cpuLimit": "1.5", "gpusPerWorker": 0}))
    assert ok.spec.workers.cpu_limit == "1.5"
    with pytest.raises(InvalidScalingRun, match=r"spec.workers.cpuLimit: must be at least spec.workers.cpu \(2\)"):
        parse_scalingrun(with_value("spec.workers", {"cpu": 2, "cpuLimit": "1999m", "gpusPerWorker": 0}))


@pytest.mark.parametrize("value, seconds", [(90, 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), (0, 0)])
def test_durations_are_seconds_or_go_units(value, seconds):
    from scalingrun_api.models import duration_seconds

    run = parse_scalingrun(with_value("spec.training.nodeLossGracePeriod", value))
    assert duration_seconds(run.spec.training.node_loss_grace_period) == seconds


@pytest.mark.parametrize("value", ["10 minutes", "1m1h", "", -5, True, 1.5])
def test_a_duration_in_other_words_is_refused_naming_the_field(value):
    with pytest.raises(InvalidScalingRun) as error:
        parse_scalingrun(with_value("spec.training.stallTimeout", value))
    assert "spec.training.stallTimeout" in str(error.value)


def test_the_stall_timeout_in_force():
    from scalingrun_api.heartbeat import stall_timeout_seconds

    assert stall_timeout_seconds("auto", 0.0) == 600.0  # the floor
    assert stall_timeout_seconds("auto", 400.0) == 1200.0  # 3x the longest gap between beats
    assert stall_timeout_seconds("2m", 400.0) == 120.0
    assert stall_timeout_seconds(0, 400.0) is None  # off
    assert parse_scalingrun(MINIMAL).spec.training.stall_timeout == "auto"
