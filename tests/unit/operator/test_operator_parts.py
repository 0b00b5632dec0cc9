"""Operator parts without a cluster: typed config from the environment (and what it must ignore), local
storage reads, metrics, command-line flags, the peering rules."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalingrun_operator import config
from scalingrun_operator.pull import storage
from scalingrun_operator.pull.store_source import target_of
from scalingrun_operator.schema import endpoints
from scalingrun_operator.cluster.metrics import Metrics


def test_config_reads_prefixed_environment():
    loaded = config.load({"SCALINGRUN_POLL_INTERVAL_SECONDS": "2.5", "SCALINGRUN_METRICS_PORT_NUMBER": "0",
                          "SCALINGRUN_NAMESPACES": "ml, team-*", "SCALINGRUN_DEBUG": "yes", "OTHER": "x"})
    assert loaded.poll_interval_seconds == 2.5 and loaded.metrics_port_number == 0 and loaded.debug is True
    assert loaded.namespaces == ("ml", "team-*")
    assert config.load({}) == config.Config()


@pytest.mark.parametrize("env,message", [
    ({"SCALINGRUN_POLL_INTERVAL_SECONDS": "soon"}, "SCALINGRUN_POLL_INTERVAL_SECONDS='soon'"),
    ({"SCALINGRUN_POLL_INTERVAL_SECONDS": "0.1"}, ">= 0.5"),
    ({"SCALINGRUN_METRICS_PORT_NUMBER": "70000"}, "port number"),
    ({"SCALINGRUN_LOG_FORMAT": "xml"}, "json or plain"),
    ({"SCALINGRUN_DEBUG": "maybe"}, "SCALINGRUN_DEBUG"),
    ({"SCALINGRUN_STATUS_TLS_SECRET": "s", "SCALINGRUN_STATUS_CA_DAYS": "30",
      "SCALINGRUN_STATUS_CERTIFICATE_DAYS": "11"}, "SCALINGRUN_STATUS_CERTIFICATE_DAYS, SCALINGRUN_STATUS_CA_DAYS"),
])
def test_config_fails_fast_naming_the_variable(env, message):
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config.load(env)


# What the kubelet injects for every Service in the pod's namespace (service links, pkg/kubelet/envvars):
# <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT, <NAME>_SERVICE_PORT_<PORT NAME>, <NAME>_PORT,
# <NAME>_PORT_<N>_<PROTO> and that with _PROTO, _PORT or _ADDR. <NAME> is any Service name, upper-cased.
SERVICE_LINK = re.compile(
    r"^[A-Z][A-Z0-9_]*_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$")


def service_link_variables(service: str, ports: list[tuple[str, int]]) -> list[str]:
    """The variable names a Service with these (name, port) pairs puts into every pod of its namespace."""
    name = service.upper().replace("-", "_")
    names = [f"{name}_SERVICE_HOST", f"{name}_SERVICE_PORT", f"{name}_PORT"]
    for port_name, port in ports:
        names.append(f"{name}_SERVICE_PORT_{port_name.upper().replace('-', '_')}")
        names += [f"{name}_PORT_{port}_TCP{suffix}" for suffix in ("", "_PROTO", "_PORT", "_ADDR")]
    return names


def test_the_service_link_pattern_matches_what_the_chart_service_injects():
    # The pattern must catch the variable that crash-looped the operator, or the next test proves nothing.
    injected = service_link_variables("scalingrun-metrics", [("metrics", 9090)])
    assert "SCALINGRUN_METRICS_PORT" in injected
    assert all(SERVICE_LINK.match(var) for var in injected), injected


def test_no_config_variable_is_a_name_a_service_link_can_produce():
    names = config.variable_names()
    assert "SCALINGRUN_METRICS_PORT_NUMBER" in names and len(names) == len(dataclasses.fields(config.Config))
    assert [var for var in names if SERVICE_LINK.match(var)] == []


def test_config_ignores_injected_service_links():
    injected = {var: "tcp://10.0.0.241:9090" for service in ("scalingrun-metrics", "scalingrun-operator", "scalingrun")
                for var in service_link_variables(service, [("metrics", 9090), ("health", 8080)])}
    injected.update({var: "10.0.0.241" for var in injected if var.endswith(("_HOST", "_ADDR"))})
    assert config.load(injected) == config.Config()


def test_operator_exits_naming_a_bad_variable_instead_of_a_traceback():
    env = {**os.environ, "SCALINGRUN_POLL_INTERVAL_SECONDS": "soon"}
    result = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "operator", "--standalone"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "SCALINGRUN_POLL_INTERVAL_SECONDS='soon' is not a valid float" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bare_operator_refuses_to_start_until_told_push_or_pull():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALINGRUN_")}
    result = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "operator", "--standalone"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "SCALINGRUN_PULL_DOCUMENTS=true" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("namespace, pattern", [("ml", False), ("team-a", False), ("team-*", True),
                                                ("!kube-system", True), ("a,b", True), ("ml-?", True)])
def test_namespace_patterns_are_told_from_names(namespace, pattern):
    from scalingrun_operator.cluster.peering import is_pattern

    assert is_pattern(namespace) is pattern


def test_peering_refuses_namespace_patterns_before_any_call():
    from scalingrun_operator.cluster.peering import PeeringError, ensure_peering

    # No API client: the refusal must come before the first request.
    with pytest.raises(PeeringError, match=r"namespace patterns \(team-\*\).*--standalone"):
        ensure_peering(None, "scalingrun", ["ml", "team-*"])


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
    metrics = Metrics()
    metrics.observe_run("u1", None)
    metrics.observe_run("u2", "Training")
    metrics.observe_run("u3", "Training")
    metrics.observe_run("u3", "Succeeded")
    value = lambda phase: metrics.registry.get_sample_value("scalingrun_runs", {"phase": phase})  # noqa: E731
    assert (value("Pending"), value("Training"), value("Succeeded")) == (1, 1, 1)
    for uid in ("u1", "u2", "u3"):
        metrics.observe_run(uid, None, deleted=True)
    assert value("Training") == 0 and metrics.tracked_runs() == 0


def test_operator_flags_override_environment():
    from scalingrun_operator import main

    base = config.load({"SCALINGRUN_NAMESPACES": "ml"})
    args = main.build_parser().parse_args(["--all-namespaces", "--standalone", "--metrics-port", "0"])
    settings = main.settings_from_args(args, base)
    assert settings.namespaces == () and settings.peering == "" and settings.metrics_port_number == 0
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

    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.local.runner import LocalRun, LocalRunError

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    for var, value in exported.items():
        monkeypatch.setenv(var, value)
    example = Path(__file__).resolve().parents[3] / "examples/06-8-single-gpu-nodes.yaml"
    run = LocalRun(parse_scalingrun(yaml.safe_load(example.read_text())), tmp_path)
    if error is None:
        run.check_credentials()
    else:
        with pytest.raises(LocalRunError, match=error):
            run.check_credentials()


def test_a_local_run_says_that_its_pod_overrides_are_not_applied(tmp_path):
    import yaml

    from scalingrun_operator.local.runner import LocalRun
    from scalingrun_operator.schema.validation import parse_scalingrun

    example = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples/06-8-single-gpu-nodes.yaml").read_text())
    said: list[str] = []
    LocalRun(parse_scalingrun(example), tmp_path, log=said.append)
    assert not any("podOverrides" in line for line in said)
    example["spec"]["podOverrides"] = [{"targets": ["workers"], "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]}]
    LocalRun(parse_scalingrun(example), tmp_path, log=said.append)
    assert [line for line in said if "podOverrides" in line] == [
        "spec.podOverrides (1) is not applied on one machine: it adds to pods (labels, volumes, env, placement), and "
        "a local run starts processes; export the variables it sets here if the training needs them"]


# --- bounded storage reads and the endpoint allow-list ---------------------------------------------


class _Stream:
    """A response body that counts what is read from it (and may announce a wrong length)."""

    def __init__(self, data: bytes):
        self.data, self.read_bytes, self.closed = data, 0, False

    def read(self, amount: int) -> bytes:
        chunk = self.data[self.read_bytes:self.read_bytes + amount]
        self.read_bytes += len(chunk)
        return chunk

    def close(self) -> None:
        self.closed = True


def test_a_document_announced_over_the_cap_is_refused_before_a_byte_is_read():
    target = storage.StorageTarget(None, "us-east-1", None, max_document_bytes=1024)
    body = _Stream(b"x" * 10_000)
    with pytest.raises(storage.DocumentTooLarge, match=r"s3://b/p\.json is 10 KiB\+, over the operator's limit of "
                                                      r"1 KiB .*SCALINGRUN_MAX_DOCUMENT_BYTES.*maxDocumentBytes"):
        storage._read_capped("s3://b/p.json", body, 10_000, target)
    assert body.read_bytes == 0 and body.closed


@pytest.mark.parametrize("announced", [None, 100], ids=["no length", "a wrong length"])
def test_a_store_that_hides_the_length_gets_one_byte_past_the_cap_read(announced):
    target = storage.StorageTarget(None, "us-east-1", None, max_document_bytes=1024)
    body = _Stream(b"x" * 5000)
    with pytest.raises(storage.DocumentTooLarge):
        storage._read_capped("s3://b/p.json", body, announced, target)
    assert body.read_bytes == 1025 and body.closed
    exact = _Stream(b"y" * 1024)
    assert storage._read_capped("s3://b/p.json", exact, None, target) == b"y" * 1024


def test_local_documents_are_capped_too(tmp_path):
    target = storage.StorageTarget(None, "us-east-1", None, max_document_bytes=2048)
    (tmp_path / "small.json").write_text(json.dumps({"pad": "x" * 2000}))
    (tmp_path / "big.json").write_text(json.dumps({"pad": "x" * 3000}))
    assert storage.read_json(str(tmp_path / "small.json"), target)["pad"] == "x" * 2000
    with pytest.raises(storage.DocumentTooLarge, match="big.json is 3 KiB"):
        storage.read_json(str(tmp_path / "big.json"), target)
    with pytest.raises(storage.DocumentTooLarge):
        storage.read_json_versioned(str(tmp_path / "big.json"), target)
    assert storage.DocumentTooLarge.reason == "DocumentTooLarge" and storage.StorageError.reason == "StorageError"


@pytest.mark.parametrize("endpoint,allowed", [
    ("http://minio.storage:9000", True),
    ("HTTP://Minio.Storage:9000/", True),  # scheme and host are case-insensitive, a trailing slash is nothing
    ("https://s3.amazonaws.com", True),
    (None, True),  # no endpoint: AWS S3, listed as https://s3.amazonaws.com
    ("https://s3.amazonaws.com:443", True),
    ("http://minio.storage", False),  # port 80, not 9000
    ("https://minio.storage:9000", False),
    ("http://minio.storage.evil:9000", False),
    ("http://minio.storage:9000/other", False),
])
def test_the_endpoint_allow_list_compares_scheme_host_port_and_path(endpoint, allowed):
    allow = ("http://minio.storage:9000", "https://s3.amazonaws.com")
    refusal = endpoints.endpoint_refusal(endpoint, allow)
    assert (refusal is None) == allowed, refusal
    if refusal:
        assert refusal.startswith("spec.storage.endpoint: ") and "operator.allowedStorageEndpoints" in refusal
    assert endpoints.endpoint_refusal(endpoint, ()) is None  # no list: any endpoint


def test_no_client_is_made_for_an_endpoint_off_the_list():
    target = storage.StorageTarget("http://elsewhere:9000", "us-east-1", None,
                                   allowed_endpoints=("http://minio.storage:9000",))
    with pytest.raises(storage.EndpointNotAllowed, match="spec.storage.endpoint: http://elsewhere:9000 is not"):
        storage.read_json("s3://bucket/progress.json", target)


def test_config_carries_the_cap_and_the_allow_list_into_storage_targets():
    loaded = config.load({"SCALINGRUN_MAX_DOCUMENT_BYTES": "4096",
                          "SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS": "http://minio.storage:9000, https://s3.amazonaws.com"})
    assert config.Config().max_document_bytes == storage.DEFAULT_MAX_DOCUMENT_BYTES == 1024 * 1024
    target = target_of(loaded, "http://minio.storage:9000", "us-east-1", None, storage.Clients())
    assert target.max_document_bytes == 4096
    assert target.allowed_endpoints == ("http://minio.storage:9000", "https://s3.amazonaws.com")
    with pytest.raises(config.ConfigError, match="SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS: 'minio:9000' is not"):
        config.load({"SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS": "minio:9000"})
    with pytest.raises(config.ConfigError, match="SCALINGRUN_MAX_DOCUMENT_BYTES must be >= 1024"):
        config.load({"SCALINGRUN_MAX_DOCUMENT_BYTES": "10"})


def test_per_run_series_follow_the_status_and_go_with_the_run():
    metrics = Metrics()
    body = {"metadata": {"namespace": "team-a", "name": "cats"}, "status": {
        "phase": "Training",
        "conditions": [{"type": "Stalled", "status": "True"}, {"type": "InputBound", "status": "False"}],
        "training": {"epoch": 3, "maxEpochs": 10, "imagesPerSecond": 412.5, "inputWaitFraction": 0.25,
                     "restarts": 2, "gpuHours": 1.5, "processHours": 3.0,
                     "heartbeat": {"time": "2026-11-27T10:00:00Z"},
                     "interruptions": {"nodeLost": 1, "evicted": 0, "podDeleted": 1}}}}
    metrics.observe_run("u1", "Training", body=body)
    run = {"namespace": "team-a", "run": "cats"}
    value = metrics.registry.get_sample_value
    assert value("scalingrun_run_phase", {**run, "phase": "Training"}) == 1
    assert value("scalingrun_run_epoch", run) == 3 and value("scalingrun_run_max_epochs", run) == 10
    assert value("scalingrun_run_images_per_second", run) == 412.5
    assert value("scalingrun_run_input_wait_ratio", run) == 0.25
    assert value("scalingrun_run_restarts_total", run) == 2
    assert value("scalingrun_run_gpu_hours_total", run) == 1.5
    assert value("scalingrun_run_interruptions_total", {**run, "cause": "nodeLost"}) == 1
    assert value("scalingrun_run_condition", {**run, "condition": "Stalled"}) == 1
    assert value("scalingrun_run_condition", {**run, "condition": "InputBound"}) == 0
    assert value("scalingrun_run_heartbeat_timestamp_seconds", run) == 1795773600.0
    # A phase change leaves one phase series, not two.
    metrics.observe_run("u1", "Succeeded", body={**body, "status": {**body["status"], "phase": "Succeeded"}})
    assert value("scalingrun_run_phase", {**run, "phase": "Training"}) is None
    assert value("scalingrun_run_phase", {**run, "phase": "Succeeded"}) == 1
    # Deleted: no series of the run is left (cardinality stays bounded by the runs that exist).
    metrics.observe_run("u1", None, deleted=True)
    exposed = [s for family in metrics.registry.collect() for s in family.samples if s.labels.get("run") == "cats"]
    assert exposed == []
