"""Operator parts without a cluster: typed config from the environment, local storage reads, metrics,
command-line flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingrun_operator import config, metrics, storage


def test_config_reads_prefixed_environment():
    loaded = config.load({"SCALINGRUN_POLL_INTERVAL_SECONDS": "2.5", "SCALINGRUN_METRICS_PORT": "0",
                          "SCALINGRUN_NAMESPACES": "ml, team-*", "SCALINGRUN_DEBUG": "yes", "OTHER": "x"})
    assert loaded.poll_interval_seconds == 2.5 and loaded.metrics_port == 0 and loaded.debug is True
    assert loaded.namespaces == ("ml", "team-*")
    assert config.load({}) == config.Config()


@pytest.mark.parametrize("env,message", [
    ({"SCALINGRUN_POLL_INTERVAL_SECONDS": "soon"}, "SCALINGRUN_POLL_INTERVAL_SECONDS='soon'"),
    ({"SCALINGRUN_POLL_INTERVAL_SECONDS": "0.1"}, ">= 0.5"),
    ({"SCALINGRUN_METRICS_PORT": "70000"}, "port number"),
    ({"SCALINGRUN_LOG_FORMAT": "xml"}, "json or plain"),
    ({"SCALINGRUN_DEBUG": "maybe"}, "SCALINGRUN_DEBUG"),
])
def test_config_fails_fast_naming_the_variable(env, message):
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config.load(env)


def test_local_storage_reads_json_and_lists(tmp_path):
    target = storage.StorageTarget(endpoint=None, region="us-east-1", credentials=None)
    (tmp_path / "_shards").mkdir()
    (tmp_path / "_shards" / "shard-00000-of-00002.json").write_text("{}")
    (tmp_path / "_manifest.json").write_text(json.dumps({"fingerprint": "x"}))
    assert storage.read_json(str(tmp_path / "_manifest.json"), target) == {"fingerprint": "x"}
    assert storage.read_json(f"file://{tmp_path}/_manifest.json", target) == {"fingerprint": "x"}
    assert storage.read_json(str(tmp_path / "absent.json"), target) is None
    assert storage.list_names(str(tmp_path / "_shards"), target) == ["shard-00000-of-00002.json"]
    assert storage.list_names(str(tmp_path / "nothing"), target) == []
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(storage.StorageError, match="not valid JSON"):
        storage.read_json(str(tmp_path / "bad.json"), target)


def test_credentials_never_show_in_repr():
    creds = storage.Credentials("AKIDEXAMPLE", "very-secret")
    assert "very-secret" not in repr(creds) and "AKIDEXAMPLE" not in repr(creds)
    target = storage.StorageTarget("http://s3:9000", "us-east-1", creds)
    assert "very-secret" not in repr(target)


def test_runs_gauge_counts_phases_and_forgets_deleted_runs():
    metrics.observe_run("u1", None)
    metrics.observe_run("u2", "Training")
    metrics.observe_run("u3", "Training")
    metrics.observe_run("u3", "Succeeded")
    value = lambda phase: metrics.REGISTRY.get_sample_value("scalingrun_runs", {"phase": phase})  # noqa: E731
    assert (value("Pending"), value("Training"), value("Succeeded")) == (1, 1, 1)
    for uid in ("u1", "u2", "u3"):
        metrics.observe_run(uid, None, deleted=True)
    assert value("Training") == 0 and metrics.tracked_runs() == 0


def test_operator_flags_override_environment():
    from scalingrun_operator import main

    base = config.load({"SCALINGRUN_NAMESPACES": "ml"})
    args = main.build_parser().parse_args(["--all-namespaces", "--standalone", "--metrics-port", "0"])
    settings = main.settings_from_args(args, base)
    assert settings.namespaces == () and settings.peering == "" and settings.metrics_port == 0
    args = main.build_parser().parse_args(["-n", "a", "-n", "b-*", "--peering", "prod"])
    settings = main.settings_from_args(args, base)
    assert settings.namespaces == ("a", "b-*") and settings.peering == "prod"
    with pytest.raises(SystemExit):
        main.build_parser().parse_args(["-A", "-n", "x"])


@pytest.mark.parametrize("exported, error", [
    ({}, "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, "export MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "MLFLOW_TRACKING_USERNAME": "u"}, "export MLFLOW_TRACKING_TOKEN"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "MLFLOW_TRACKING_TOKEN": "t"}, None),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "MLFLOW_TRACKING_USERNAME": "u",
      "MLFLOW_TRACKING_PASSWORD": "p"}, None),
])
def test_local_run_needs_exported_credentials_for_each_secret_it_names(monkeypatch, tmp_path, exported, error):
    import yaml

    from scalingrun_operator.api.validation import parse_scalingrun
    from scalingrun_operator.local.runner import LocalRun, LocalRunError

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    for var, value in exported.items():
        monkeypatch.setenv(var, value)
    example = Path(__file__).resolve().parents[2] / "examples/06-8-single-gpu-nodes.yaml"
    run = LocalRun(parse_scalingrun(yaml.safe_load(example.read_text())), tmp_path)
    if error is None:
        run.check_credentials()
    else:
        with pytest.raises(LocalRunError, match=error):
            run.check_credentials()
