"""The operator's own pod fitted to a cluster (issue #52, item 2): podLabels, podAnnotations, extraEnv and
topologySpreadConstraints reach it; runs.allowHostPath reaches the operator's settings; what the chart owns (its
labels, the SCALINGRUN_* settings) cannot be set through them."""

from __future__ import annotations

import subprocess

import pytest

from scalingrun_operator.config import load
from tests.support.chart import CHART, helm, render  # noqa: F401 (fixtures)

VALUES = CHART / "ci/operator-pod-values.yaml"


def pod(helm, *args) -> dict:
    return next(o for o in render(helm, *args) if o["kind"] == "Deployment")["spec"]["template"]


def test_the_values_reach_the_operators_pod(helm):
    template = pod(helm, VALUES)
    spec, container = template["spec"], template["spec"]["containers"][0]
    assert template["metadata"]["labels"]["cost-center"] == "ml-platform"
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "scalingrun"  # the chart's own stay
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    names = [e["name"] for e in container["env"]]
    assert names[-2:] == ["HTTPS_PROXY", "NO_PROXY"]
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"


def test_allow_host_path_reaches_the_operators_settings_and_is_off_by_default(helm):
    def settings(*args):
        env = pod(helm, *args)["spec"]["containers"][0]["env"]
        return load({e["name"]: e["value"] for e in env if "value" in e})

    assert settings(VALUES).allow_host_path is True
    assert settings().allow_host_path is False
    default = pod(helm)
    assert "topologySpreadConstraints" not in default["spec"] and "cost-center" not in default["metadata"]["labels"]


@pytest.mark.parametrize("bad", [["--set", "podLabels.app\\.kubernetes\\.io/name=other"],
                                 ["--set", "podLabels.scalingrun\\.dev/status-endpoint=x"],
                                 ["--set", "extraEnv[0].name=SCALINGRUN_DEBUG", "--set", "extraEnv[0].value=1"],
                                 ["--set", "extraEnv[0].value=no-name"],
                                 ["--set", "topologySpreadConstraints[0].maxSkew=1"],
                                 ["--set", "runs.allowHostPath=yes"], ["--set", "runs.hostPath=true"]])
def test_what_the_chart_owns_is_refused(helm, bad):
    result = subprocess.run([helm, "template", "t", str(CHART), *bad], capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr
