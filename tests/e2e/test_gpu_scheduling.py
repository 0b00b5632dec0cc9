"""GPU scheduling without a GPU (issue 39, item 5): the nodes advertise a fake extended resource, nvidia.com/gpu: 4,
written into their status as a device plugin would (none runs), and carry the taint that GPU node pools carry.

- A run asking for more GPUs per worker than a node has: its workers stay Pending, and the root cause names the
  resource (the scheduler's verdict, quoted).
- A 2-worker run with 1 GPU each, on the CPU trainer image named explicitly (CI cannot build the GPU images): its
  workers are scheduled onto the tainted nodes (the operator's GPU tolerations), hold the fake GPUs, mount /dev/shm
  as a memory-backed emptyDir of spec.workers.sharedMemory; the launcher, which asks for no GPU and so tolerates no
  GPU taint, is held off by that taint until the test removes it (on a GPU cluster it runs on a CPU node). The run
  trains on the CPU, Succeeds, and says so in GPUsUnused, with the CPUImageWithGPUs warning.

Both runs share one dataset: the first preprocesses it before the taint is set (the preprocessing pod, too,
tolerates no GPU taint); the second reuses it (on the push path its Job finds the dataset and ends), made suspended
before the taint and resumed under it.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from typing import Any, Iterator

import pytest

from tests.e2e.environment import status_push
from tests.support.fake_gpus import FAKE_GPUS, GPU_RESOURCE, advertised, fake_gpus, heartbeats, wait_advertised
from tests.support.e2e_runs import _name, children, condition_texts, finished, phase, run_body

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]

TAINT_KEY = GPU_RESOURCE  # what GKE's GPU node pools put on their nodes, and most EKS and AKS ones
TAINT = f"{TAINT_KEY}=present:NoSchedule"
SHARED_MEMORY = "256Mi"
DOCKER_SHM_BYTES = 64 * 2**20  # a container's own /dev/shm, which the emptyDir replaces


@contextlib.contextmanager
def gpu_taint(cluster, nodes: list[str]) -> Iterator[None]:
    """TAINT on `nodes` until the block ends, however it ends (the other e2e tests share these nodes)."""
    try:
        subprocess.run([*cluster.kubectl, "taint", "nodes", *nodes, TAINT, "--overwrite"], check=True,
                       capture_output=True, text=True)
        yield
    finally:
        subprocess.run([*cluster.kubectl, "taint", "nodes", *nodes, f"{TAINT_KEY}:NoSchedule-"],
                       capture_output=True, text=True)
        tainted = [n.metadata.name for n in cluster.core().list_node().items
                   if any(t.key == TAINT_KEY for t in n.spec.taints or [])]
        assert not tainted, f"the GPU taint is still on {tainted}"


def gpu_run_body(cluster, name: str, output: str, gpus: int) -> dict[str, Any]:
    """The e2e's small run (2 workers at 500m), 32 px, 1 epoch, with `gpus` per worker on the CPU image."""
    body = run_body(cluster, name, output=output, epochs=1)
    body["spec"]["dataset"]["imageSize"] = 32
    # Laid out for the larger run's processes (2 x (FAKE_GPUS + 1)), so that both runs' datasets are the same one.
    body["spec"]["dataset"]["preprocessing"]["readers"] = 2 * (FAKE_GPUS + 1)
    body["spec"]["workers"].update({"gpusPerWorker": gpus, "sharedMemory": SHARED_MEMORY,
                                    "image": cluster.trainer_image})
    return body


def pods_by_role(cluster, name: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"launcher": [], "worker": []}
    for pod in cluster.run_pods(name):
        role = (pod.metadata.labels or {}).get("training.kubeflow.org/job-role")
        if role in out and pod.metadata.deletion_timestamp is None:
            out[role].append(pod)
    return out


def wait_pods(cluster, name: str, done, timeout: float, what: str) -> dict[str, list[Any]]:
    deadline = time.monotonic() + timeout
    while True:
        pods = pods_by_role(cluster, name)
        if done(pods):
            return pods
        if time.monotonic() > deadline:
            summary = {role: [(p.metadata.name, p.status.phase, p.spec.node_name,
                               [(c.type, c.status, c.message) for c in p.status.conditions or []]) for p in ps]
                       for role, ps in pods.items()}
            pytest.fail(f"{name}: not {what} within {timeout:.0f} s: {summary}\n"
                        f"{condition_texts(cluster.get_run(name))}")
        time.sleep(1)


def unschedulable_message(pod) -> str:
    return next((c.message or "" for c in pod.status.conditions or []
                 if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"), "")


def shm_in_container(cluster, pod: str) -> tuple[str, int]:
    """(filesystem type, size in bytes) of /dev/shm as the worker's container sees it."""
    script = "awk '$2 == \"/dev/shm\" {print $3}' /proc/mounts | tail -n1; df -B1 --output=size /dev/shm | tail -n1"
    out = subprocess.run([*cluster.kubectl, "exec", "-n", cluster.namespace, pod, "-c", "worker", "--",
                          "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kind, size = out.stdout.split()
    return kind, int(size)


def test_gpu_runs_are_scheduled_on_advertised_gpus_tolerate_the_taint_and_say_they_train_on_cpu(cluster):
    started = time.monotonic()
    output = f"s3://scalingrun-e2e/runs/{_name('gpus')}/parquet"  # one dataset for both runs
    with fake_gpus(cluster, FAKE_GPUS) as nodes:
        written = heartbeats(cluster, nodes)
        wait_advertised(cluster, nodes, FAKE_GPUS)

        # More GPUs per worker than a node has: Pending, and the root cause names the resource.
        toomany = _name("gpus-toomany")
        cluster.create_run(gpu_run_body(cluster, toomany, output, gpus=FAKE_GPUS + 1))
        try:
            run = cluster.wait(toomany, lambda r: f"Insufficient {GPU_RESOURCE}" in condition_texts(r), timeout=420,
                               what=f"naming {GPU_RESOURCE} as what its workers wait for")
            text = condition_texts(run)
            print(f"{toomany}: {phase(run)}\n{text}")
            assert f"{toomany}-train-worker-" in text and "gpusPerWorker" in text, text
            workers = pods_by_role(cluster, toomany)["worker"]
            assert len(workers) == 2 and all(p.status.phase == "Pending" and not p.spec.node_name
                                             for p in workers), workers
        finally:
            cluster.delete_run(toomany)

        # Within the fake GPUs, on tainted nodes. Made suspended before the taint: its preprocessing Job (on the push
        # path it runs, finds the dataset and ends) tolerates no GPU taint and this cluster has no other node for it,
        # as a GPU cluster has CPU nodes. Resumed once the taint is on, so that the launcher meets it.
        name = _name("gpus")
        body = gpu_run_body(cluster, name, output, gpus=1)
        body["spec"].setdefault("runPolicy", {})["suspend"] = True
        cluster.create_run(body)
        try:
            cluster.wait(name, lambda r: children(cluster, name).get("MPIJob"), timeout=300,
                         what="its MPIJob, made suspended")
        except BaseException:
            cluster.delete_run(name)
            raise
        with gpu_taint(cluster, nodes):
            cluster.custom().patch_namespaced_custom_object("scalingrun.dev", "v1alpha1", cluster.namespace,
                                                            "scalingruns", name, {"spec": {"runPolicy": {
                                                                "suspend": False}}})
            try:
                pods = wait_pods(cluster, name, lambda p: len(p["worker"]) == 2 and all(
                    w.status.phase == "Running" for w in p["worker"]), timeout=240, what="running its 2 workers")
                # The dataset is reused: no Job in pull mode; on the push path its Job finds it and ends at once.
                assert children(cluster, name)["Job"] == ([f"{name}-preprocess"] if status_push() else [])
                for worker in pods["worker"]:
                    spec = worker.spec
                    assert spec.node_name in nodes
                    assert any(t.key == TAINT_KEY and t.operator == "Exists" and t.effect == "NoSchedule"
                               for t in spec.tolerations), spec.tolerations
                    container = next(c for c in spec.containers if c.name == "worker")
                    assert container.resources.limits[GPU_RESOURCE] == "1", container.resources
                    shm = next(v for v in spec.volumes if v.empty_dir and v.empty_dir.medium == "Memory")
                    assert shm.empty_dir.size_limit == SHARED_MEMORY, shm
                    assert any(m.name == shm.name and m.mount_path == "/dev/shm" for m in container.volume_mounts)
                    kind, size = shm_in_container(cluster, worker.metadata.name)
                    # Kubernetes < 1.22 mounts the tmpfs unsized and evicts past sizeLimit; 1.22+ sizes it.
                    assert kind == "tmpfs" and size > DOCKER_SHM_BYTES, (kind, size)
                # The launcher asks for no GPU: the taint holds it off, as it would off a GPU node pool.
                pods = wait_pods(cluster, name, lambda p: p["launcher"] and unschedulable_message(p["launcher"][0]),
                                 timeout=240, what="a launcher the taint keeps off the nodes")
                held = unschedulable_message(pods["launcher"][0])
                print(f"launcher while tainted: {held}")
                assert TAINT_KEY in held, held
            except BaseException:
                cluster.delete_run(name)
                raise
        try:
            run = cluster.wait(name, finished, timeout=600, what="Succeeded on the CPU")
            status = run["status"]
            gpus_unused = next(c for c in status["conditions"] if c["type"] == "GPUsUnused")
            print(f"GPUsUnused: {gpus_unused}")
            assert gpus_unused["status"] == "True" and gpus_unused["reason"] == "NoGPUVisible", gpus_unused
            assert "gpusPerWorker is 1" in gpus_unused["message"], gpus_unused
            assert cluster.trainer_image in gpus_unused["message"], gpus_unused
            assert status["training"]["processes"] == 2 and status["training"]["epoch"] == 1, status["training"]
            warnings = [e.message for e in cluster.events(name) if e.reason == "CPUImageWithGPUs"]
            assert warnings and cluster.trainer_image in warnings[0], [e.reason for e in cluster.events(name)]
            # The kubelet kept the resource it does not serve for the whole test, through its status writes if any.
            print(f"the kubelet's status writes during the test (Ready heartbeat): {written} -> "
                  f"{heartbeats(cluster, nodes)}")
            assert all(advertised(cluster, n) == {"capacity": str(FAKE_GPUS), "allocatable": str(FAKE_GPUS)}
                       for n in nodes), {n: advertised(cluster, n) for n in nodes}
        finally:
            cluster.delete_run(name)
    print(f"GPU scheduling test: {time.monotonic() - started:.0f} s")
