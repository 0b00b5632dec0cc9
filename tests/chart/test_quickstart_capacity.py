"""The cluster quick start's capacity arithmetic over the real chart as helm renders it, the demo store and the
run's children as the operator renders them; the README quotes the sums, so a change of any request shows here."""

from __future__ import annotations

import pytest

from scalingrun_operator.builders import build_children
from scalingrun_demo import quickstart_sizing as sizing, seaweedfs
from scalingrun_demo.footprint import LABELS, SECRET
from scalingrun_demo.quickstart import WORKER_CPUS, run_document
from scalingrun_operator.schema.validation import parse_scalingrun
from tests.support.chart import ROOT, helm, render  # noqa: F401 (fixture)

GIB = 2 ** 30


def quickstart_demands(helm: str, worker_cpu: str, worker_memory: str = "4Gi") -> list[sizing.Demand]:
    chart = render(helm, None, release="scalingrun")
    store = seaweedfs.demo_manifests("demo", seaweedfs.IMAGE, SECRET, "", "", LABELS)
    run = parse_scalingrun(run_document("demo", None, None, worker_cpu, worker_memory))
    return (sizing.demands(chart, "operator") + sizing.demands(store, "SeaweedFS")
            + sizing.demands(build_children(run, namespace="demo")))


def node(name: str, cpu: str, memory: str = "16Gi", **spec) -> dict:
    return {"metadata": {"name": name}, "spec": spec, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def pod(on: str, cpu: str, phase: str = "Running", memory: str = "0") -> dict:
    return {"spec": {"nodeName": on, "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": phase}}


def test_the_readme_quotes_the_arithmetic_of_the_real_requests(helm):
    readme = (ROOT / "README.md").read_text()
    for worker_cpu in WORKER_CPUS:
        line = sizing.arithmetic(quickstart_demands(helm, worker_cpu))
        assert f"`{line}`" in readme, f"README.md should quote, for --worker-cpu {worker_cpu}: {line}"


def test_the_operator_counts_once_per_replica_and_the_run_its_larger_phase(helm):
    wanted = quickstart_demands(helm, "500m", "2Gi")
    operator = next(d for d in wanted if d.what == "operator")
    chart_values = render(helm, None, "--set", "replicaCount=3", release="scalingrun")
    assert sizing.demands(chart_values, "operator")[0].pods == 3 and operator.pods == 2
    cpu, memory = sizing.needed(wanted)
    training = sum(d.pods * d.cpu for d in wanted if d.when == sizing.TRAINING)
    preprocessing = sum(d.pods * d.cpu for d in wanted if d.when == sizing.PREPROCESSING)
    assert training > preprocessing  # the launcher comes on top of the workers
    assert cpu == pytest.approx(sum(d.pods * d.cpu for d in wanted if d.when == sizing.ALWAYS) + training)
    assert memory >= 2 * 2 * GIB


def test_a_two_cpu_node_with_a_control_plane_fits_only_the_smallest_workers(helm):
    """kind's control plane on a 2-CPU node requests 950m (apiserver 250m, controller-manager 200m, etcd, scheduler,
    kindnet 100m each, coredns 2 x 100m): 1.05 CPU free."""
    nodes = [node("kind-control-plane", "2")]
    system = [pod("kind-control-plane", cpu) for cpu in ("250m", "200m", "100m", "100m", "100m", "100m", "100m")]
    finished = [pod("kind-control-plane", "4", phase="Succeeded")]  # requests nothing any more
    free = sizing.capacity(nodes, system + finished)
    assert free.free_cpu == pytest.approx(1.05)
    chosen, lines = sizing.choose([(cpu, quickstart_demands(helm, cpu, "1Gi")) for cpu in WORKER_CPUS], free)
    assert chosen == "250m"
    assert lines[0] == "free: 1.05 CPU and 16Gi free on 1 node (2 CPU allocatable, 950m requested by the pods already there)"
    assert [line.rsplit(": ", 1)[1] for line in lines[1:]] == ["does not fit", "does not fit", "fits"]
    assert lines[2].startswith("workers at 500m CPU: operator 2 x 100m + SeaweedFS 1 x 100m + max(")


def test_too_little_is_refused_with_every_sum_and_a_cordoned_node_counts_for_nothing(helm):
    nodes = [node("small", "800m"), node("cordoned", "64", unschedulable=True)]
    free = sizing.capacity(nodes, [])
    assert (free.nodes, free.allocatable_cpu) == (1, 0.8)
    with pytest.raises(ValueError) as refused:
        sizing.choose([(cpu, quickstart_demands(helm, cpu)) for cpu in WORKER_CPUS], free)
    lines = str(refused.value).splitlines()
    assert len(lines) == 1 + len(WORKER_CPUS) and all(line.endswith("does not fit") for line in lines[1:])


def test_a_pod_larger_than_any_one_node_does_not_fit_though_the_sum_does(helm):
    wanted = quickstart_demands(helm, "1", "1Gi")
    two_small = sizing.capacity([node("a", "1.5"), node("b", "1.5")], [])
    assert sizing.fits(wanted, two_small)  # 2.4 of 3 CPU, each pod at most 1
    crowded = sizing.capacity([node("a", "2"), node("b", "2")], [pod("a", "1.5"), pod("b", "1.5")])
    assert crowded.free_cpu == pytest.approx(1.0) and not sizing.fits(wanted, crowded)
    memory_short = sizing.capacity([node("a", "8", memory="2Gi")], [])
    assert not sizing.fits(wanted, memory_short)
