"""A day of faults (issue 55): K concurrent ScalingRuns on the e2e's cluster and a seeded random schedule of faults
for M minutes, then the invariants checked, each a line of the report, and the figures (faults by kind, recoveries,
time from a fault to training again p50/p95 by kind, epochs redone per fault) with the seed to replay it.

Runs inside a `scripts/e2e.sh --keep` session (its exports name the cluster; any cluster by
SCALINGRUN_TEST_KUBECONFIG, the node cluster for the freeze and the kubelet):

    flock /work/node.lock bash -c 'eval "$(scripts/e2e.sh --keep -k no_such_test | grep ^export)" &&
        .venv/bin/python bench/chaos.py --seed 55 --runs 3 --minutes 5 --faults 12; scripts/e2e.sh --down'

Slots cycle through keras, lightning, elastic (an elastic run asks for the node's extended resource
tests/support/node_faults.py advertises; capacity_drop takes part of it away); a slot whose run ends starts another
while the soak lasts. The schedule is printed first; bench/chaos_plan.py makes it, bench/chaos_faults.py applies it,
bench/chaos_invariants.py checks what was recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.chaos_faults import Faults, operator_memory_limit, operator_rss  # noqa: E402
from bench.chaos_invariants import RunRecord, Sample, measure_recovery, verdicts  # noqa: E402
from bench.chaos_plan import DEFAULT_MIX, Applied, figures, parse_mix, schedule  # noqa: E402
from tests.support.e2e_cluster import connect, missing_variables  # noqa: E402
from tests.support.e2e_runs import child_objects, run_body  # noqa: E402
from tests.support.node_faults import CAPACITY, node_capacity  # noqa: E402

SLOT_KINDS = ("keras", "lightning", "elastic")
OUTPUT = "s3://scalingrun-e2e/chaos/parquet"  # one dataset: the first run preprocesses it, the others reuse it
SAMPLE_EVERY_S = 3.0


def log(line: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {line}", flush=True)


def body_for(cluster: Any, kind: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    body = run_body(cluster, name, output=OUTPUT, epochs=args.epochs, worker_cpu=args.worker_cpu, patience=args.epochs,
                    image=cluster.lightning_image if kind == "lightning" else None)
    spec = body["spec"]
    spec["dataset"]["imageSize"] = 32
    spec["dataset"]["preprocessing"].update(readers=4, resources={"cpu": "250m", "memory": "1Gi"})
    spec["training"].update(stallTimeout=args.stall_timeout, nodeLossGracePeriod=20,
                            maxInterruptions=args.max_interruptions)
    spec["workers"].update(replicas=args.workers, memory=args.worker_memory, terminationGracePeriod=10)
    if kind == "lightning":
        spec["training"]["framework"] = "pytorch-lightning"
    if kind == "elastic":  # as tests/e2e/test_elastic.py's: a unit of CAPACITY per worker
        spec["workers"].update(replicas=2, minReplicas=1, resizeAfter=15, gpuResource=CAPACITY, gpusPerWorker=1,
                               cpuLimit="1")
    return body


class Soak:
    def __init__(self, cluster: Any, args: argparse.Namespace):
        self.cluster, self.args = cluster, args
        self.slots = [SLOT_KINDS[i % len(SLOT_KINDS)] for i in range(args.runs)]
        self.current: list[Optional[str]] = [None] * args.runs
        self.records: dict[str, RunRecord] = {}
        self.status: dict[str, dict] = {}
        self.applied: list[Applied] = []
        self.rss: list[int] = []
        self.lock = threading.Lock()
        self.finishing: list[threading.Thread] = []
        self.started = 0

    def run_of(self, slot: int) -> tuple[Optional[str], dict]:
        with self.lock:
            name = self.current[slot]
            return name, dict(self.status.get(name, {})) if name else {}

    def start_run(self, slot: int) -> None:
        self.started += 1
        name = f"chaos-{self.slots[slot][:5]}-{self.started}-{uuid.uuid4().hex[:4]}"
        self.cluster.create_run(body_for(self.cluster, self.slots[slot], name, self.args))
        with self.lock:
            self.current[slot] = name
            self.records[name] = RunRecord(name, self.slots[slot])
        log(f"slot {slot}: {name} created")

    def sample(self) -> None:
        for slot, name in enumerate(list(self.current)):
            if name is None:
                continue
            try:
                run = self.cluster.get_run(name)
            except Exception as exc:  # the API server through a fault: the next read
                log(f"read {name}: {type(exc).__name__}")
                continue
            status = run.get("status") or {}
            training = status.get("training") or {}
            beat = training.get("heartbeat") or {}
            record = self.records[name]
            record.samples.append(Sample(time.time(), status.get("phase"), training.get("epoch"),
                                         parse_time(beat.get("time")), beat.get("launcherUid"),
                                         beat.get("phase"), training.get("resumedFromEpoch")))
            with self.lock:
                self.status[name] = status
            if status.get("phase") in ("Succeeded", "Failed"):
                record.ended_at = time.time()
                with self.lock:
                    self.current[slot] = None
                thread = threading.Thread(target=self.finish, args=(name, run), daemon=True)
                thread.start()
                self.finishing.append(thread)
                log(f"slot {slot}: {name} {status.get('phase')} at epoch {training.get('epoch')}, "
                    f"interruptions {nonzero(training.get('interruptions'))}")

    def finish(self, name: str, run: dict) -> None:
        """Reads what the store holds of the run, deletes it, and looks for anything left of it."""
        record = self.records[name]
        status = run.get("status") or {}
        record.phase, record.conditions = status.get("phase"), status.get("conditions") or []
        record.interruptions = nonzero((status.get("training") or {}).get("interruptions"))
        record.epoch = (status.get("training") or {}).get("epoch")
        read_store(self.cluster, record, run)
        record.left_behind = delete_and_look(self.cluster, name)

    def loop(self) -> None:
        args = self.args
        plan = schedule(args.seed, args.minutes, args.faults, self.slots, args.mix,
                        start=args.warm_up, freeze_hold=args.stall_timeout + 30)
        print(f"chaos: seed {args.seed}, {args.runs} runs {self.slots}, {args.minutes} min, {len(plan)} faults, "
              f"mix {args.mix}")
        for fault in plan:
            print(f"  {fault.line()}")
        sys.stdout.flush()
        faults = Faults(self.cluster, self.run_of, 2 * self.slots.count("elastic"), args.seed, log)
        begin = time.time()
        end = begin + args.minutes * 60
        pending, appliers = list(plan), []
        next_rss = begin
        while time.time() < end or any(self.current):
            now = time.time()
            while pending and now >= begin + pending[0].at and now < end:
                fault = pending.pop(0)
                thread = threading.Thread(target=lambda f=fault: self.record_fault(faults, f), daemon=True)
                thread.start()
                appliers.append(thread)
            self.sample()
            # The first run preprocesses the shared dataset alone; the others start once it trains (and reuse it).
            ready = any(s.phase == "Training" for r in self.records.values() for s in r.samples)
            for slot, name in enumerate(self.current):
                if name is None and now < end - args.min_left and (ready or slot == 0):
                    try:
                        self.start_run(slot)
                    except Exception as exc:  # the API server through a fault: the next round
                        log(f"slot {slot}: create failed: {type(exc).__name__}: {str(exc)[:200]}")
            if now >= next_rss:
                next_rss = now + 15
                threading.Thread(target=self.sample_rss, daemon=True).start()
            if now > end + args.drain:
                log(f"drain of {args.drain} s over: {[n for n in self.current if n]} still running")
                break
            time.sleep(SAMPLE_EVERY_S)
        for thread in appliers:
            thread.join(timeout=args.stall_timeout + 120)
        for slot, name in enumerate(self.current):  # past the drain: recorded as they stand, then deleted
            if name:
                self.finish(name, self.cluster.get_run(name))
        for thread in self.finishing:
            thread.join(timeout=300)
        self.report(begin)

    def record_fault(self, faults: Faults, fault) -> None:
        try:
            applied = faults.apply(fault)
        except Exception as exc:
            applied = Applied(fault, None, False, time.time(), why_not=f"{type(exc).__name__}: {exc}"[:300])
        with self.lock:
            self.applied.append(applied)
        log(f"{fault.line()}: {'took' if applied.took else 'did not take: ' + applied.why_not} "
            f"{applied.run or ''} {' '.join(applied.notes)}")

    def sample_rss(self) -> None:
        with contextlib.suppress(Exception):
            rss = operator_rss(self.cluster)
            if rss:
                self.rss.append(rss)

    def report(self, begin: float) -> None:
        runs = list(self.records.values())
        for applied in self.applied:
            measure_recovery(applied, runs, SAMPLE_EVERY_S)
        limit = operator_memory_limit(self.cluster)
        checks = verdicts(runs, self.applied, self.args.stall_timeout, self.args.grace, limit, self.rss)
        figs = figures(self.applied)
        print(f"\n== chaos report: seed {self.args.seed}, {len(runs)} runs, {self.args.minutes} min, "
              f"{len(self.applied)} faults ({sum(a.took for a in self.applied)} took hold) ==")
        for run in runs:
            print(f"  {run.name} ({run.slot_kind}): {run.phase} epoch {run.epoch}, interruptions {run.interruptions}, "
                  f"history {run.history}")
        print("faults by kind (scheduled, took hold, back training, time back p50/p95 s, epochs redone mean/max):")
        for kind, f in figs.items():
            print(f"  {kind}: {f['scheduled']}, {f['took']}, {f['recovered']}, {f['back_p50_s']}/{f['back_p95_s']}, "
                  f"{f['redone_epochs_mean']}/{f['redone_epochs_max']}")
        print(f"operator RSS peak {max(self.rss, default=0) / 2**20:.0f} MiB of {limit / 2**20:.0f} MiB "
              f"({len(self.rss)} samples)")
        broken = 0
        for line, failures in checks:
            broken += bool(failures)
            print(f"  {'OK    ' if not failures else 'BROKEN'} {line}" + "".join(f"\n      {f}" for f in failures))
        print(f"{broken} invariants broken; replay: bench/chaos.py --seed {self.args.seed} --runs {self.args.runs} "
              f"--minutes {self.args.minutes} --faults {self.args.faults} --mix {mix_text(self.args.mix)}")
        if self.args.json:
            Path(self.args.json).write_text(json.dumps({
                "seed": self.args.seed, "runs": len(runs), "slots": self.slots, "minutes": self.args.minutes,
                "faults": [vars(a.fault) | {"run": a.run, "took": a.took, "why_not": a.why_not,
                                            "back_after": a.back_after, "redone": a.redone} for a in self.applied],
                "figures": figs, "invariants": {line: f for line, f in checks},
                "rss_peak": max(self.rss, default=0), "rss_limit": limit,
                "run_results": {r.name: [r.phase, r.epoch, r.interruptions] for r in runs}}, indent=1))
        self.broken = broken


def read_store(cluster: Any, record: RunRecord, run: dict) -> None:
    from pyarrow import fs as pafs

    location = f"{OUTPUT}/runs/{record.name}"[len("s3://"):]
    for attempt in range(3):
        try:
            with cluster.s3() as s3:
                with contextlib.suppress(FileNotFoundError, OSError):
                    document = json.loads(s3.open_input_stream(f"{location}/progress.json").read())
                    record.history = [entry["epoch"] for entry in document.get("history") or []]
                model = (run.get("status") or {}).get("modelUri")
                if model:
                    info = s3.get_file_info(model[len("s3://"):])
                    record.model_size = info.size if info.type == pafs.FileType.File else None
                files = s3.get_file_info(pafs.FileSelector(f"{location}/checkpoints", recursive=True,
                                                           allow_not_found=True))
                record.checkpoints = sum(f.type == pafs.FileType.File for f in files)
                return
        except Exception as exc:  # the store's pod killed meanwhile: again
            log(f"store read for {record.name}: {type(exc).__name__}: {exc}")
            time.sleep(10)


def delete_and_look(cluster: Any, name: str, timeout: float = 120) -> list[str]:
    """Deletes the run, then what is still there of it after `timeout` s: pods (capacity probes too), MPIJob, Jobs,
    ConfigMaps."""
    with contextlib.suppress(BaseException):  # its pods not gone in time: listed below
        cluster.delete_run(name, timeout=timeout)
    deadline = time.monotonic() + 60
    while True:
        left = [f"pod {p.metadata.name}" for p in cluster.run_pods(name)] + \
            [f"{kind} {n}" for kind, objects in child_objects(cluster, name).items() for n, _ in objects]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(2)


def parse_time(text: Optional[str]) -> Optional[float]:
    import datetime as dt

    if not text:
        return None
    with contextlib.suppress(ValueError):
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return None


def nonzero(counts: Optional[dict]) -> dict[str, int]:
    return {k: v for k, v in (counts or {}).items() if v}


def mix_text(mix: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in mix.items())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=55)
    parser.add_argument("--runs", type=int, default=3, help="K: concurrent runs (slots)")
    parser.add_argument("--minutes", type=float, default=5, help="M: how long faults are injected")
    parser.add_argument("--faults", type=int, default=12, help="faults in the schedule")
    parser.add_argument("--mix", type=parse_mix, default=dict(DEFAULT_MIX), help="kind=weight,...")
    parser.add_argument("--warm-up", type=float, default=120, help="s before the first fault")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="workers of a keras or lightning run")
    parser.add_argument("--worker-cpu", default="150m")
    parser.add_argument("--worker-memory", default="1536Mi")
    parser.add_argument("--stall-timeout", type=float, default=60)
    parser.add_argument("--grace", type=float, default=240, help="s past stallTimeout a restart may take here")
    parser.add_argument("--max-interruptions", type=int, default=10)
    parser.add_argument("--min-left", type=float, default=120, help="no new run with less of the soak left (s)")
    parser.add_argument("--drain", type=float, default=420, help="s after the soak for the runs to end")
    parser.add_argument("--json", default="", help="also write the report here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    missing = missing_variables()
    if missing:
        parser.error(f"needs {', '.join(missing)}: run it inside a `scripts/e2e.sh --keep` session")
    cluster = connect()
    for node in cluster.core().list_node().items:
        log(f"node {node.metadata.name}: allocatable cpu {node.status.allocatable.get('cpu')}, "
            f"memory {node.status.allocatable.get('memory')}")
    soak = Soak(cluster, args)
    elastic_units = 2 * soak.slots.count("elastic")
    with node_capacity(cluster, elastic_units) if elastic_units else contextlib.nullcontext():
        soak.loop()
    return 1 if soak.broken else 0


if __name__ == "__main__":
    sys.exit(main())
