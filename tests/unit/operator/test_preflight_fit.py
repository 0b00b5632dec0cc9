"""The namespace's runs against what the cluster offers (cluster/preflight_fit.py), judged without a cluster: the GPU
resource and count a run asks for against the nodes' allocatable, the driver labels against the floor install.md
states, Kueue's integrations and LocalQueues. tests/integration/test_preflight_fit.py gathers the facts from a real
API server."""

from __future__ import annotations

import re
from pathlib import Path

from scalingrun_operator.cluster.preflight_fit import (
    DRIVER_FLOOR, FitFacts, Node, RunAsk, judge_fit, kueue_frameworks, node_facts, run_ask,
)

ROOT = Path(__file__).resolve().parents[3]


def checks(facts: FitFacts) -> dict[str, tuple[str, str]]:
    return {check.name: (check.level, check.message) for check in judge_fit(facts)}


def test_a_run_asking_for_a_resource_no_node_has_or_more_than_a_node_has_is_an_error():
    nodes = [Node("gpu-a", {"nvidia.com/gpu": 4}, 580), Node("gpu-b", {"nvidia.com/gpu": 8}, 590), Node("cpu", {})]
    fits = checks(FitFacts("team", nodes, [RunAsk("small", "nvidia.com/gpu", 8), RunAsk("cpu-run", None, 0)]))
    assert fits["gpu-resource"] == ("ok", "GPU resources allocatable: nvidia.com/gpu: gpu-a 4, gpu-b 8; the 1 active "
                                          "run(s) in team asking for GPUs fit a node")
    mig = checks(FitFacts("team", nodes, [RunAsk("sliced", "nvidia.com/mig-1g.10gb", 1)]))["gpu-resource"]
    assert mig[0] == "error" and "run sliced asks for nvidia.com/mig-1g.10gb, which no node advertises" in mig[1]
    assert "nvidia.com/gpu: gpu-a 4, gpu-b 8" in mig[1] and "mixed strategy" in mig[1]
    big = checks(FitFacts("team", nodes, [RunAsk("big", "nvidia.com/gpu", 16)]))["gpu-resource"]
    assert big[0] == "error" and "asks for 16 nvidia.com/gpu a worker, more than any node has (8)" in big[1]
    # Another vendor's resource counts once a run asks for it.
    amd = [Node("amd-a", {"amd.com/gpu": 2})]
    assert checks(FitFacts("team", amd, [RunAsk("r", "amd.com/gpu", 2)]))["gpu-resource"][0] == "ok"
    none = checks(FitFacts("team", [Node("cpu", {})], []))
    assert none["gpu-resource"][0] == "info" and "gpusPerWorker: 0" in none["gpu-resource"][1]
    assert none["gpu-driver"] == ("info", "no node advertises an NVIDIA GPU: no driver to check")
    assert checks(FitFacts("team", None, None))["gpu-resource"][0] == "unknown"


def test_the_driver_labels_are_held_to_the_floor_install_md_states():
    floor = re.search(r"^\| NVIDIA driver \(GPU runs only\) \| R(\d+) or newer \|",
                      (ROOT / "docs/install.md").read_text(), re.M)
    assert floor and int(floor.group(1)) == DRIVER_FLOOR
    gpu = {"nvidia.com/gpu": 1}
    ok = checks(FitFacts("team", [Node("a", gpu, DRIVER_FLOOR), Node("b", gpu, DRIVER_FLOOR + 10)], []))
    assert ok["gpu-driver"] == ("ok", f"driver R{DRIVER_FLOOR}+ on every GPU node (a {DRIVER_FLOOR}, "
                                      f"b {DRIVER_FLOOR + 10})")
    old = checks(FitFacts("team", [Node("a", gpu, 550), Node("b", gpu)], []))["gpu-driver"]
    assert old[0] == "warning" and old[1].startswith(f"driver below R{DRIVER_FLOOR} on a 550")
    assert "b carry no driver label" in old[1]
    unlabelled = checks(FitFacts("team", [Node("a", {"nvidia.com/mig-1g.10gb": 7})], []))["gpu-driver"]
    assert unlabelled[0] == "info" and "nvidia.com/cuda.driver.major" in unlabelled[1] and "nvidia-smi" in unlabelled[1]


def test_node_and_run_facts_are_read_as_the_api_server_returns_them():
    node = node_facts({"metadata": {"name": "n", "labels": {"nvidia.com/cuda.driver.major": "575"}},
                       "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4",
                                                  "nvidia.com/mig-1g.10gb": "0", "hugepages-2Mi": "0"}}})
    assert node == Node("n", {"nvidia.com/gpu": 4}, 575)
    newer = node_facts({"metadata": {"name": "m", "labels": {"nvidia.com/cuda.driver-version.major": "580"}},
                        "status": {}})
    assert newer == Node("m", {}, 580)
    assert run_ask({"metadata": {"name": "r"}, "spec": {"workers": {}}}) == RunAsk("r", "nvidia.com/gpu", 1)
    assert run_ask({"metadata": {"name": "r"}, "spec": {"workers": {"gpusPerWorker": 0, "gpuResource": "x.io/g"},
                                                        "runPolicy": {"kueueQueueName": "q"}}}) == RunAsk(
        "r", None, 0, "q")


def test_kueue_integration_and_local_queues():
    nodes = [Node("cpu", {})]
    queued = [RunAsk("a", None, 0, "team-queue"), RunAsk("b", None, 0, "team-queue")]
    absent = checks(FitFacts("team", nodes, queued, kueue_served=False))
    assert "kueue-mpijob" not in absent
    assert absent["kueue-queue"][0] == "error" and "Kueue is not installed" in absent["kueue-queue"][1]
    assert "kueue-queue" not in checks(FitFacts("team", nodes, [], kueue_served=False))

    full = {"kueue-system/kueue-manager-config": ["batch/job", "kubeflow.org/mpijob"]}
    ready = checks(FitFacts("team", nodes, queued, True, {"team-queue"}, full))
    assert ready["kueue-mpijob"] == ("ok", "Kueue (kueue-system/kueue-manager-config) manages kubeflow.org/mpijob, "
                                           "batch/job")
    assert ready["kueue-queue"] == ("ok", "the runs' queues are LocalQueues in team: team-queue (run a, b)")
    lacking = checks(FitFacts("team", nodes, queued, True, set(), {"k/kueue-manager-config": ["batch/job"]}))
    assert lacking["kueue-mpijob"][0] == "error" and "does not manage kubeflow.org/mpijob" in lacking["kueue-mpijob"][1]
    assert lacking["kueue-queue"][0] == "error" and "no LocalQueue in team for team-queue (run a, b)" in (
        lacking["kueue-queue"][1])
    idle = checks(FitFacts("team", nodes, [], True, {"q1"}, None))
    assert idle["kueue-mpijob"][0] == "unknown" and idle["kueue-queue"][0] == "info"
    # Kueue without an integrations section manages Jobs only.
    assert kueue_frameworks({"apiVersion": "config.kueue.x-k8s.io/v1beta1"}) == ["batch/job"]
    assert kueue_frameworks({"integrations": {"frameworks": ["kubeflow.org/mpijob"]}}) == ["kubeflow.org/mpijob"]
