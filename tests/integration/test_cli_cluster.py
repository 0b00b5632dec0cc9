"""`scalingrun get` and `scalingrun wait` against a real kube-apiserver: the status the operator writes (here
patched by the test, as the operator would), read as a user reads it."""

from __future__ import annotations

import copy
import json
import queue
import subprocess
import sys
import threading

import pytest
from kubernetes import client

from scalingrun_api import models
from tests.support.specs import MINIMAL

pytestmark = pytest.mark.k8s


def create_run(api_client, namespace: str, name: str) -> None:
    body = copy.deepcopy(MINIMAL)
    body["metadata"] = {"name": name}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        models.GROUP, models.VERSION, namespace, models.PLURAL, body)


def patch_status(api_client, namespace: str, name: str, status: dict) -> None:
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"status": status})


def cli(kubeconfig: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "scalingrun_operator.cli", *args, "--kubeconfig", kubeconfig]


TRAINING = {"phase": "Training", "message": "epoch 3 of 10",
            "training": {"epoch": 3, "maxEpochs": 10, "imagesPerSecond": 812.4, "inputWaitFraction": 0.12,
                         "bestEpoch": 2, "bestMetrics": {"val_accuracy": 0.8583}, "restarts": 1}}


def test_get_shows_the_runs_status_as_a_table_and_as_data(api_client, scalingrun_crd, scalingsweep_crd, namespace,
                                                          kubeconfig):
    create_run(api_client, namespace, "quick")
    patch_status(api_client, namespace, "quick", TRAINING)
    result = subprocess.run(cli(kubeconfig, "get", "-n", namespace), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "WORKERS", "EPOCH", "IMG/S", "INPUT-WAIT", "BEST-VAL-ACC", "ETA",
                              "RESTARTS", "MESSAGE"]
    assert row.split() == ["quick", "Training", "1", "3/10", "812", "12%", "0.8583", "@2", "-", "1", "epoch", "3",
                           "of", "10"]
    result = subprocess.run(cli(kubeconfig, "get", "quick", "-n", namespace, "-o", "json"), capture_output=True,
                            text=True, timeout=120)
    assert json.loads(result.stdout)["status"]["training"]["bestMetrics"] == {"val_accuracy": 0.8583}
    result = subprocess.run(cli(kubeconfig, "get", "missing", "-n", namespace), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and result.stderr.strip() == (
        f"scalingrun get: ScalingRun or ScalingSweep missing not found in namespace {namespace}")


def _lines(process: subprocess.Popen) -> "queue.Queue[str]":
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    return lines


def _line_with(lines: "queue.Queue[str]", words: str) -> str:
    while True:
        line = lines.get(timeout=60)  # a bound, so that a broken watch fails instead of hanging
        if words in line:
            return line


def test_get_watch_prints_a_row_at_every_change(api_client, scalingrun_crd, scalingsweep_crd, namespace, kubeconfig):
    create_run(api_client, namespace, "watched")
    process = subprocess.Popen(cli(kubeconfig, "get", "watched", "-w", "-n", namespace), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        lines = _lines(process)
        _line_with(lines, "NAME")
        assert _line_with(lines, "watched").split()[1] == "-"  # no phase yet
        patch_status(api_client, namespace, "watched", TRAINING)
        assert "3/10" in _line_with(lines, "Training")
        patch_status(api_client, namespace, "watched", {"phase": "Succeeded", "message": "done"})
        assert _line_with(lines, "Succeeded").split()[-1] == "done"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_wait_returns_when_the_phase_is_reached(api_client, scalingrun_crd, scalingsweep_crd, namespace,
                                                kubeconfig):
    create_run(api_client, namespace, "awaited")
    process = subprocess.Popen(cli(kubeconfig, "wait", "awaited", "--for", "Succeeded", "--timeout", "5m", "-n",
                                   namespace), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    patch_status(api_client, namespace, "awaited", TRAINING)
    patch_status(api_client, namespace, "awaited", {"phase": "Succeeded", "message": "done"})
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.strip() == "scalingrun/awaited Succeeded"


def test_wait_fails_when_the_run_fails_or_the_time_is_up(api_client, scalingrun_crd, scalingsweep_crd, namespace,
                                                         kubeconfig):
    create_run(api_client, namespace, "doomed")
    patch_status(api_client, namespace, "doomed", {"phase": "Failed", "message": "pod doomed-worker-0: OOMKilled"})
    result = subprocess.run(cli(kubeconfig, "wait", "doomed", "-n", namespace), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == ("scalingrun wait: ScalingRun doomed is Failed, it will not be Succeeded: "
                                     "pod doomed-worker-0: OOMKilled")
    create_run(api_client, namespace, "slow")
    patch_status(api_client, namespace, "slow", {"phase": "Training", "conditions": [
        {"type": "Ready", "status": "False", "reason": "Training"}]})
    result = subprocess.run(cli(kubeconfig, "wait", "slow", "--for", "condition=Ready=False", "-n", namespace),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "scalingrun/slow Ready False"
    result = subprocess.run(cli(kubeconfig, "wait", "slow", "--timeout", "2s", "-n", namespace),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == ("scalingrun wait: timed out after 2s waiting for ScalingRun slow to be "
                                     "Succeeded (phase Training)")
    result = subprocess.run(cli(kubeconfig, "wait", "slow", "--timeout", "soon", "-n", namespace),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--timeout soon: seconds or a duration" in result.stderr
