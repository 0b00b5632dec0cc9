"""The Argo CD health check, run by a real Lua interpreter (lupa) on ScalingRun objects."""

from __future__ import annotations

import runpy
from pathlib import Path

import lupa
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
LUA = (ROOT / "manifests/argocd/scalingrun-health.lua").read_text()


def health(obj: dict) -> tuple[str, str]:
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)

    def to_lua(value):
        if isinstance(value, dict):
            return runtime.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([to_lua(v) for v in value])
        return value

    runtime.globals().obj = to_lua(obj)
    result = runtime.execute(LUA)
    return result["status"], result["message"]


def run(status=None, generation=1):
    obj = {"metadata": {"name": "r", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize("obj,expected,words", [
    (run(), "Progressing", "Waiting for the scalingrun operator"),
    (run({"phase": "Pending", "observedGeneration": 1}), "Progressing", "Pending"),
    (run({"phase": "Training", "observedGeneration": 1, "training": {"epoch": 3, "maxEpochs": 10}}),
     "Progressing", "epoch 3/10"),
    (run({"phase": "Training", "observedGeneration": 1}, generation=2), "Progressing", "not yet observed"),
    (run({"phase": "Succeeded", "observedGeneration": 1, "modelUri": "s3://b/m.keras"}), "Healthy", "s3://b/m.keras"),
    (run({"phase": "Suspended", "observedGeneration": 1}), "Suspended", "suspend"),
    (run({"phase": "Queued", "observedGeneration": 1}), "Progressing", "Queued"),
    (run({"phase": "Failed", "observedGeneration": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "MPIJobFailed", "message": "launcher exited 1"}]}),
     "Degraded", "MPIJobFailed: launcher exited 1"),
    (run({"phase": "Preprocessing", "observedGeneration": 1, "conditions": [
        {"type": "Failed", "status": "False", "reason": "X"}]}), "Progressing", "Preprocessing"),
])
def test_health_follows_phase_and_conditions(obj, expected, words):
    status, message = health(obj)
    assert status == expected and words in message


def test_argocd_cm_patch_embeds_the_same_lua():
    patch = yaml.safe_load((ROOT / "manifests/argocd/argocd-cm-patch.yaml").read_text())
    assert patch["data"]["resource.customizations.health.scalingrun.dev_ScalingRun"] == LUA
    generator = runpy.run_path(str(ROOT / "scripts/argocd_cm.py"))  # not as __main__: writes nothing
    assert generator["render"]() == (ROOT / "manifests/argocd/argocd-cm-patch.yaml").read_text(), \
        "run scripts/argocd_cm.py"
