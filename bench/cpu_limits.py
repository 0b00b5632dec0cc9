"""What a CPU limit costs a 2-worker run: images/s, all-reduce time and CFS throttling, with a CPU limit equal to
the request (500m; the default) and without one (`spec.workers.cpuLimit` set to the node's cores: a quota that
never binds), in the e2e's real cluster.

Runs inside a `scripts/e2e.sh --keep` session (it reads the exports that script prints):

    eval "$(scripts/e2e.sh --keep -k no_such_test | grep ^export)" && .venv/bin/python bench/cpu_limits.py
    scripts/e2e.sh --down

Every run is a ScalingRun of its own on one shared dataset (the first run preprocesses it, the others reuse it),
variants interleaved (limit, none, none, limit, ...) so that a drift in the host's load hits both. Each is
created suspended, so that Horovod's timeline can be switched on in its MPIJob before any pod starts (the
launcher's mpirun forwards HOROVOD_TIMELINE to every rank), then resumed; cleanPodPolicy None keeps its workers after
the run, so that the timeline and each worker container's cgroup counters (cpu.stat, cpuacct.usage) can be read.

Per run: images/s (the trainer's own figure, validation excluded) of every epoch after the first; from rank 0's
timeline, the all-reduce ops' wall time (overlapping ops merged) and the negotiation wait (from the first rank
ready to the last: how long the fastest rank waits for the slowest); per worker, CFS periods throttled and the
CPU used. The summary gives medians per variant and the limit's figures as ratios of the no-limit baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.e2e_cluster import InCluster, connect, missing_variables  # noqa: E402
from tests.e2e.environment import upload_jpegs  # noqa: E402

TIMELINE = "/tmp/horovod-timeline.json"
GROUP, VERSION = "scalingrun.dev", "v1alpha1"


def run_body(cluster: InCluster, name: str, source: str, output: str, cpu: str, cpu_limit: str,
             epochs: int) -> dict[str, Any]:
    workers = {"replicas": 2, "gpusPerWorker": 0, "cpu": cpu, "cpuLimit": cpu_limit, "memory": "2Gi",
               "image": cluster.trainer_image}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ScalingRun", "metadata": {"name": name},
        "spec": {
            "storage": {"endpoint": cluster.s3_endpoint, "credentialsSecret": cluster.s3_secret},
            "dataset": {"source": source, "output": output, "imageSize": 64, "validationFraction": 0.2, "seed": 7,
                        "preprocessing": {"parallelism": 1, "resources": {"cpu": "500m", "memory": "1Gi"}}},
            "model": {"base": "efficientnet_lite0", "weights": "imagenet"},
            "training": {"batchSizePerWorker": 16, "maxEpochs": epochs, "earlyStopping": {"enabled": False},
                         "featureCache": "off"},  # the whole network every epoch, as measured before the cache
            "workers": workers,
            "runPolicy": {"suspend": True, "cleanPodPolicy": "None"},
        },
    }


def wait_phase(cluster: InCluster, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = cluster.get_run(name)
        phase = (run.get("status") or {}).get("phase")
        if phase in phases:
            return run
        if phase == "Failed":
            raise SystemExit(f"{name} failed: {(run.get('status') or {}).get('message')}")
        time.sleep(2)
    raise SystemExit(f"{name}: not {'/'.join(phases)} within {timeout:.0f} s")


def switch_on_timeline(cluster: InCluster, name: str) -> None:
    """HOROVOD_TIMELINE for every rank: set in the launcher, forwarded by its mpirun (the MPIJob has no pods yet)."""
    mpijob = cluster.custom().get_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.namespace, "mpijobs",
                                                           f"{name}-train")
    launcher = "/spec/mpiReplicaSpecs/Launcher/template/spec/containers/0"
    script = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][-1]
    assert " mpirun " in script, script
    patch = [{"op": "add", "path": f"{launcher}/env/-", "value": {"name": "HOROVOD_TIMELINE", "value": TIMELINE}},
             {"op": "replace", "path": f"{launcher}/command/2",
              "value": script.replace(" mpirun ", " mpirun -x HOROVOD_TIMELINE ", 1)}]
    subprocess.run([*cluster.kubectl, "patch", "-n", cluster.namespace, "mpijobs.kubeflow.org", f"{name}-train",
                    "--type=json", "-p", json.dumps(patch)], check=True, capture_output=True)


def in_worker(cluster: InCluster, pod: str, script: str) -> str:
    result = subprocess.run([*cluster.kubectl, "exec", "-n", cluster.namespace, pod, "-c", "worker", "--",
                             "sh", "-c", script], capture_output=True, text=True, timeout=120)
    return result.stdout if result.returncode == 0 else ""


def cgroup_counters(cluster: InCluster, pod: str) -> dict[str, float]:
    """CFS periods and throttling (cpu.stat) and CPU seconds used (cpuacct.usage) of the worker container."""
    text = in_worker(cluster, pod, "cat /sys/fs/cgroup/cpu/cpu.stat; echo usage $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage)")
    values = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
    return {"periods": float(values.get("nr_periods", 0)), "throttled": float(values.get("nr_throttled", 0)),
            "throttled_s": float(values.get("throttled_time", 0)) / 1e9, "cpu_s": float(values.get("usage", 0)) / 1e9}


def parse_timeline(text: str) -> list[dict[str, Any]]:
    """Horovod writes its timeline as a JSON array it may never close."""
    body = text.strip().rstrip(",")
    if not body:
        return []
    if not body.endswith("]"):
        body += "]"
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return json.loads(body[:body.rfind("}") + 1] + "]")


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def allreduce_figures(events: list[dict[str, Any]]) -> dict[str, float]:
    """Ops of all tensors, by phase: B/E pairs nest per tensor (pid); fused tensors share one op's time."""
    stacks: dict[Any, list[tuple[str, float]]] = {}
    spans: dict[str, list[tuple[float, float]]] = {"NEGOTIATE_ALLREDUCE": [], "ALLREDUCE": []}
    for event in events:
        if event.get("ph") == "B":
            stacks.setdefault(event.get("pid"), []).append((event.get("name", ""), float(event["ts"])))
        elif event.get("ph") == "E" and stacks.get(event.get("pid")):
            name, start = stacks[event.get("pid")].pop()
            if name in spans:
                spans[name].append((start, float(event["ts"])))
    ops = _merged(spans["ALLREDUCE"])
    waits = _merged(spans["NEGOTIATE_ALLREDUCE"])
    if not ops:
        return {}
    return {"ops": len(ops), "allreduce_ms": statistics.median(e - s for s, e in ops) / 1e3,
            "allreduce_total_s": sum(e - s for s, e in ops) / 1e6,
            "negotiate_ms": statistics.median(e - s for s, e in waits) / 1e3 if waits else 0.0,
            "negotiate_total_s": sum(e - s for s, e in waits) / 1e6}


def read_progress(cluster: InCluster, output: str, name: str) -> dict[str, Any]:
    with cluster.s3() as s3:
        return json.loads(s3.open_input_stream(f"{output[len('s3://'):]}/runs/{name}/progress.json").read())


def node_cores(cluster: InCluster) -> str:
    """The most CPU capacity of a node: as a limit, a quota that never binds (the pod can use every core)."""
    return str(max(int(n.status.capacity["cpu"]) for n in cluster.core().list_node().items))


def measure(cluster: InCluster, variant: str, cpu: str, cpu_limit: str, source: str, output: str,
            epochs: int) -> dict[str, Any]:
    name = f"cpubench-{variant}-{uuid.uuid4().hex[:4]}"
    load_before = os.getloadavg()[0]
    cluster.create_run(run_body(cluster, name, source, output, cpu, cpu_limit, epochs))
    try:
        wait_phase(cluster, name, ("Suspended",), timeout=600)
        switch_on_timeline(cluster, name)
        cluster.custom().patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, "scalingruns", name,
                                                        {"spec": {"runPolicy": {"suspend": False}}})
        started = time.monotonic()
        wait_phase(cluster, name, ("Succeeded",), timeout=1200)
        wall = time.monotonic() - started
        progress = read_progress(cluster, output, name)
        rates = [e["imagesPerSecond"] for e in progress["history"][1:]]
        workers = [f"{name}-train-worker-{i}" for i in range(2)]
        counters = [cgroup_counters(cluster, pod) for pod in workers]
        timeline: dict[str, float] = {}
        for pod in workers:
            events = parse_timeline(in_worker(cluster, pod, f"cat {TIMELINE} 2>/dev/null"))
            timeline = allreduce_figures(events) if events else timeline
            if timeline:
                break
    finally:
        cluster.delete_run(name)
    return {"run": name, "variant": variant, "images_per_s": statistics.median(rates), "epoch_rates": rates,
            "wall_s": wall, "load": (load_before, os.getloadavg()[0]), "workers": counters, **timeline}


def show(row: dict[str, Any]) -> str:
    throttled = ", ".join(f"{w['throttled']:.0f}/{w['periods']:.0f} periods {w['throttled_s']:.1f} s"
                          for w in row["workers"])
    cpu = "+".join(f"{w['cpu_s']:.0f}" for w in row["workers"])
    allreduce = (f"all-reduce median {row['allreduce_ms']:.1f} ms x {row['ops']} ({row['allreduce_total_s']:.1f} s), "
                 f"negotiation median {row['negotiate_ms']:.1f} ms ({row['negotiate_total_s']:.1f} s)"
                 if "ops" in row else "no timeline")
    return (f"{row['variant']:5} {row['run']}: {row['images_per_s']:6.1f} img/s "
            f"(epochs 2+: {', '.join(f'{r:.0f}' for r in row['epoch_rates'])}); {allreduce}; "
            f"throttled {throttled}; CPU {cpu} s; run {row['wall_s']:.0f} s; load {row['load'][0]:.1f}->{row['load'][1]:.1f}")


FIGURES = ("images_per_s", "allreduce_ms", "negotiate_ms", "wall_s")


def summary(rows: list[dict[str, Any]]) -> str:
    """Medians per variant, and the limit's figures as a ratio of the no-limit baseline: of the medians, and the
    median of each repetition's pair (its two runs back to back, so that a drift in the host's load cancels)."""
    lines, medians = [], {}
    for variant in ("limit", "none"):
        mine = [r for r in rows if r["variant"] == variant]
        medians[variant] = {key: statistics.median(r[key] for r in mine) for key in FIGURES
                            if mine and all(key in r for r in mine)}
        lines.append(f"median {variant:5}: " + ", ".join(f"{k} {v:.1f}" for k, v in medians[variant].items()))
    ratios = {k: medians["limit"][k] / medians["none"][k] for k in medians["limit"]
              if medians["none"].get(k)}
    lines.append("limit / no limit (baseline), of the medians: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    pairs = [{r["variant"]: r for r in rows[i:i + 2]} for i in range(0, len(rows) - 1, 2)]
    paired = {k: [p["limit"][k] / p["none"][k] for p in pairs if p["none"].get(k) and k in p["limit"]]
              for k in FIGURES}
    lines.append("limit / no limit (baseline), median of the pairs: " + ", ".join(
        f"{k} {statistics.median(v):.2f}x ({', '.join(f'{x:.2f}' for x in v)})" for k, v in paired.items() if v))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=3, help="runs per variant (default 3)")
    parser.add_argument("--cpu", default="500m", help="workers' cpu request, and the limit when there is one")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--images-per-class", type=int, default=150, help="64 px Fashion-MNIST JPEGs, 10 classes")
    args = parser.parse_args(argv)
    missing = missing_variables()
    if missing:
        raise SystemExit(f"needs {', '.join(missing)}: run it in a `scripts/e2e.sh --keep` session (see --help)")
    cluster = connect()
    source = f"s3://scalingrun-e2e/bench/fashion-mnist-{args.images_per_class}/jpeg"
    output = f"s3://scalingrun-e2e/bench/cpu-limits-{uuid.uuid4().hex[:6]}/parquet"
    with cluster.s3() as s3:
        uploaded = upload_jpegs(s3, source, args.images_per_class, 64)
    unbound = node_cores(cluster)
    print(f"{source}: {uploaded or 'already'} JPEGs uploaded; workers 2 x cpu {args.cpu}, memory 2Gi, cpuLimit "
          f"{args.cpu} (limit) or {unbound}, the node's cores (none: a quota that never binds); {args.epochs} epochs; "
          f"host: {os.cpu_count()} cores", flush=True)
    rows = []
    for repetition in range(args.repetitions):
        order = ("limit", "none") if repetition % 2 == 0 else ("none", "limit")
        for variant in order:
            limit = args.cpu if variant == "limit" else unbound
            rows.append(measure(cluster, variant, args.cpu, limit, source, output, args.epochs))
            print(show(rows[-1]), flush=True)
    print(summary(rows))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
