"""`scalingrun doctor` in the e2e's cluster: the checks that tests/integration/test_preflight.py brings up one fact at
a time on a bare API server, here on a cluster that really has them: the MPIJob controller (the e2e's stand-in, a
Deployment), the operator's pods with a kubelet behind them, so /healthz is answered through the API server's pod
proxy. Then the GPU checks with the GPU e2e's fake GPUs on every node (tests/support/fake_gpus.py): the resource
allocatable per node, the driver unknown (no GPU feature discovery labels here), and Kueue absent.
"""

from __future__ import annotations

import time

import pytest

from scalingrun_operator.cli import main
from scalingrun_operator.cluster.preflight_fit import DRIVER_LABELS
from tests.e2e.mpijob_controller.deploy import NAME as MPIJOB_CONTROLLER
from tests.e2e.environment import SYSTEM_NAMESPACE
from tests.support.fake_gpus import FAKE_GPUS, GPU_RESOURCE, advertised, fake_gpus

pytestmark = pytest.mark.e2e


def doctor(cluster, capsys, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    code = main(["doctor", "--kubeconfig", cluster.kubeconfig, *args])
    out = capsys.readouterr().out
    print(out)
    checks = {}
    for line in out.splitlines():
        level, name, message = line.split(None, 2)
        checks[name] = (level, message)
    return code, checks, out


def test_doctor_reports_the_clusters_mpi_controller_and_a_healthy_operator(cluster, capsys):
    code, checks, out = doctor(cluster, capsys)
    assert code == 0, out
    assert checks["mpijob-api"][0] == "ok"
    level, message = checks["mpijob-controller"]
    assert level == "ok" and f"/{MPIJOB_CONTROLLER}" in message, message
    assert checks["crd-version"][0] == "ok", checks["crd-version"]
    level, message = checks["operator"]
    assert level == "ok" and f"operator {SYSTEM_NAMESPACE}/" in message and "/healthz answered" in message, message


def test_doctor_reports_the_fake_gpus_per_node_and_kueue_absent(cluster, capsys):
    with fake_gpus(cluster, FAKE_GPUS) as nodes:
        deadline = time.monotonic() + 60
        while any(advertised(cluster, n)["allocatable"] != str(FAKE_GPUS) for n in nodes):
            assert time.monotonic() < deadline, {n: advertised(cluster, n) for n in nodes}
            time.sleep(1)
        code, checks, out = doctor(cluster, capsys, "-n", cluster.namespace)
    level, message = checks["gpu-resource"]
    each = ", ".join(f"{node} {FAKE_GPUS}" for node in sorted(nodes))
    assert level == "ok" and message.startswith(f"GPU resources allocatable: {GPU_RESOURCE}: {each}"), message
    level, message = checks["gpu-driver"]
    assert level == "info" and f"{', '.join(sorted(nodes))} carry no driver label ({DRIVER_LABELS[0]}" in message, message
    assert checks["kueue"][0] == "info" and "kueue-mpijob" not in checks, out
