"""`scalingrun doctor` in the e2e's cluster: the checks that tests/integration/test_preflight.py brings up one fact at
a time on a bare API server, here on a cluster that really has them: the MPIJob controller (the e2e's stand-in, a
Deployment), the operator's pods with a kubelet behind them, so /healthz is answered through the API server's pod
proxy."""

from __future__ import annotations

import pytest

from scalingrun_operator.cli import main
from tests.e2e.mpijob_controller.deploy import NAME as MPIJOB_CONTROLLER
from tests.e2e.environment import SYSTEM_NAMESPACE

pytestmark = pytest.mark.e2e


def test_doctor_reports_the_clusters_mpi_controller_and_a_healthy_operator(cluster, capsys):
    code = main(["doctor", "--kubeconfig", cluster.kubeconfig])
    out = capsys.readouterr().out
    print(out)
    checks = {}
    for line in out.splitlines():
        level, name, message = line.split(None, 2)
        checks[name] = (level, message)
    assert code == 0, out
    assert checks["mpijob-api"][0] == "ok"
    level, message = checks["mpijob-controller"]
    assert level == "ok" and f"/{MPIJOB_CONTROLLER}" in message, message
    assert checks["crd-version"][0] == "ok", checks["crd-version"]
    level, message = checks["operator"]
    assert level == "ok" and f"operator {SYSTEM_NAMESPACE}/" in message and "/healthz answered" in message, message
