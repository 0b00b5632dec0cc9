"""A day of faults (issue 55): K concurrent ScalingRuns on the e2e's cluster and a seeded random schedule of faults
for M minutes, then the invariants checked, each a line of the report, and the figures (faults by kind, recoveries,
time from a fault to training again p50/p95 by kind, epochs redone per fault) with the seed to replay it.

Runs inside a `scripts/e2e.sh --keep` session (its exports name the cluster; any cluster by
SCALINGRUN_TEST_KUBECONFIG, the node cluster for the freeze and the kubelet):

    flock /work/node.lock bash -c 'eval "$(scripts/e2e.sh --keep -k no_such_test | grep ^export)" &&
        export SCALINGRUN_TOOLS="$(bash scripts/tools.sh)" &&
        /work/main/.venv/bin/python bench/chaos.py --seed 55 --runs 3 --minutes 5 --faults 12; scripts/e2e.sh --down'

Slots cycle through keras, lightning, elastic (an elastic run asks for the node's extended resource
tests/support/node_faults.py advertises; capacity_drop takes part of it away), the fifth of 5 or more a sweep over 1
and 2 workers (or --slots names them); a slot whose run ends starts another while a run of its kind still fits in the
soak (bench/chaos_pace.py); after the M minutes the soak waits for every run to end, as long as their epochs left
take at their kind's pace. The schedule is printed first; bench/chaos_plan.py makes it, bench/chaos_faults.py applies
it, bench/chaos_invariants.py checks what was recorded (bench/chaos_store.py reads the store and loads the models).
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
from bench.chaos_invariants import RunRecord, Sample, SweepRecord, measure_recovery, verdicts  # noqa: E402
from bench.chaos_pace import SWEEP_POINTS, drain_seconds, min_left, parse_slots, slot_cycle  # noqa: E402
from bench.chaos_plan import DEFAULT_MIX, Applied, figures, mix_text, parse_mix, schedule  # noqa: E402
from bench.chaos_store import (  # noqa: E402
    GROUP, SWEEPS, VERSION, body_for, delete_and_look, delete_sweep_and_look, nonzero, parse_time, read_store,
    sweep_body, sweep_point,
)
from tests.support.e2e_cluster import connect, missing_variables  # noqa: E402
from tests.support.node_faults import node_capacity  # noqa: E402

SAMPLE_EVERY_S = 3.0
STALL_EVENT_CHARS = 700
TERMINAL = ("Succeeded", "Failed")


def log(line: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {line}", flush=True)


class Soak:
    def __init__(self, cluster: Any, args: argparse.Namespace):
        self.cluster, self.args = cluster, args
        self.slots = args.slots or slot_cycle(args.runs)
        self.current: list[Optional[str]] = [None] * len(self.slots)  # a run's name, or a sweep's
        self.records: dict[str, RunRecord] = {}
        self.sweeps: dict[str, SweepRecord] = {}
        self.status: dict[str, dict] = {}
        self.applied: list[Applied] = []
        self.rss: list[int] = []
        self.lock = threading.Lock()
        self.finishing: list[threading.Thread] = []
        self.started = 0

    def run_of(self, slot: int) -> tuple[Optional[str], dict]:
        """A slot's run now (a sweep's: its point training now) and its last status."""
        with self.lock:
            name = self.current[slot]
            if name in self.sweeps:
                name = next((p for p in self.sweeps[name].points if p in self.records
                             and self.records[p].ended_at is None), None)
            return name, dict(self.status.get(name, {})) if name else {}

    def start_run(self, slot: int) -> None:
        self.started += 1
        kind = self.slots[slot]
        name = f"chaos-{kind[:5]}-{self.started}-{uuid.uuid4().hex[:4]}"
        if kind == "sweep":
            self.cluster.custom().create_namespaced_custom_object(GROUP, VERSION, self.cluster.namespace, SWEEPS,
                                                                  sweep_body(self.cluster, name, self.args))
            with self.lock:
                self.sweeps[name] = SweepRecord(name, [sweep_point(name, w) for w in SWEEP_POINTS])
        else:
            self.cluster.create_run(body_for(self.cluster, kind, name, self.args))
            with self.lock:
                self.records[name] = RunRecord(name, kind)
        with self.lock:
            self.current[slot] = name
        log(f"slot {slot}: {name} created")

    def sample(self) -> None:
        for slot, name in enumerate(list(self.current)):
            if name is None:
                continue
            if name in self.sweeps:
                self.sample_sweep(slot, self.sweeps[name])
            elif self.sample_run(name):
                with self.lock:
                    self.current[slot] = None
                log(f"slot {slot}: {name} {self.records[name].phase}")

    def sample_run(self, name: str) -> bool:
        """Reads the run's status into its record; True when it ended (then read, deleted and looked after aside)."""
        try:
            run = self.cluster.get_run(name)
        except Exception as exc:  # the API server through a fault: the next read
            log(f"read {name}: {type(exc).__name__}")
            return False
        status = run.get("status") or {}
        training = status.get("training") or {}
        beat = training.get("heartbeat") or {}
        record = self.records[name]
        record.samples.append(Sample(time.time(), status.get("phase"), training.get("epoch"),
                                     parse_time(beat.get("time")), beat.get("launcherUid"),
                                     beat.get("phase"), training.get("resumedFromEpoch"),
                                     nonzero(training.get("interruptions"))))
        with self.lock:
            self.status[name] = status
        if status.get("phase") not in TERMINAL:
            return False
        record.ended_at = time.time()
        thread = threading.Thread(target=self.finish, args=(name, run, record.slot_kind != "sweep"), daemon=True)
        thread.start()
        self.finishing.append(thread)
        log(f"{name} {status.get('phase')} at epoch {training.get('epoch')}, "
            f"interruptions {nonzero(training.get('interruptions'))}")
        return True

    def sample_sweep(self, slot: int, sweep: SweepRecord) -> None:
        """Samples the sweep's point runs (each a record of its own, slot kind 'sweep'), then the sweep; when it ended,
        it is deleted and what is left of it and its points looked for."""
        for i, point in enumerate(sweep.points):
            if point not in self.records:
                try:
                    self.cluster.get_run(point)
                except Exception:  # not created yet (or the API server through a fault)
                    break
                with self.lock:
                    self.records[point] = RunRecord(point, "sweep", points_after=len(sweep.points) - i - 1)
            if self.records[point].ended_at is None and not self.sample_run(point):
                break
        try:
            body = self.cluster.custom().get_namespaced_custom_object(GROUP, VERSION, self.cluster.namespace, SWEEPS,
                                                                      sweep.name)
        except Exception as exc:
            log(f"read {sweep.name}: {type(exc).__name__}")
            return
        status = body.get("status") or {}
        if status.get("phase") not in TERMINAL or any(self.records[p].ended_at is None for p in sweep.points
                                                      if p in self.records):
            return
        sweep.phase, sweep.message = status.get("phase"), status.get("message") or ""
        sweep.recommended = (status.get("recommendation") or {}).get("run")
        with self.lock:
            self.current[slot] = None
        log(f"slot {slot}: {sweep.name} {sweep.phase}, recommended {sweep.recommended}")
        thread = threading.Thread(target=self.finish_sweep, args=(sweep,), daemon=True)
        thread.start()
        self.finishing.append(thread)

    def finish_sweep(self, sweep: SweepRecord) -> None:
        for thread in [t for t in self.finishing if t is not threading.current_thread()]:
            thread.join(timeout=300)  # its points' store reads first: they need the runs
        sweep.left_behind = delete_sweep_and_look(self.cluster, sweep.name)

    def finish(self, name: str, run: dict, delete: bool = True) -> None:
        """Reads what the store holds of the run, deletes it (a sweep's point: its sweep does) and looks for anything
        left of it."""
        record = self.records[name]
        status = run.get("status") or {}
        record.phase, record.conditions = status.get("phase"), status.get("conditions") or []
        record.interruptions = nonzero((status.get("training") or {}).get("interruptions"))
        record.epoch = (status.get("training") or {}).get("epoch")
        with contextlib.suppress(Exception):  # the operator's account of each stall, for a count not expected
            record.stall_events = [f"{event.last_timestamp or event.event_time} {event.message[:STALL_EVENT_CHARS]}"
                                   for event in self.cluster.events(name) if event.reason == "Stalled"]
        read_store(self.cluster, record, run, log)
        if delete:
            record.left_behind = delete_and_look(self.cluster, name)

    def running(self) -> list[RunRecord]:
        """The runs still going; a sweep between points (or before its first): its next point, not sampled yet."""
        going = []
        for slot, name in enumerate(self.current):
            point = self.run_of(slot)[0]
            if point in self.records:
                going.append(self.records[point])
            elif name in self.sweeps:
                points = self.sweeps[name].points
                after = [p for p in points if p not in self.records]
                if after:
                    going.append(RunRecord(after[0], "sweep", points_after=len(after) - 1))
            elif name in self.records:
                going.append(self.records[name])
        return going

    def loop(self) -> None:
        args = self.args
        plan = schedule(args.seed, args.minutes, args.faults, self.slots, args.mix,
                        start=args.warm_up, freeze_hold=args.stall_timeout + 30)
        print(f"chaos: seed {args.seed}, {len(self.slots)} slots {self.slots}, {args.minutes} min, {len(plan)} faults, "
              f"mix {args.mix}")
        for fault in plan:
            print(f"  {fault.line()}")
        sys.stdout.flush()
        faults = Faults(self.cluster, self.run_of, 2 * self.slots.count("elastic"), args.seed, log)
        begin = time.time()
        end = begin + args.minutes * 60
        pending, appliers = list(plan), []
        next_rss, drain_until = begin, None
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
            every = list(self.records.values())
            for slot, name in enumerate(self.current):
                kind = self.slots[slot]
                if name is None and now < end - min_left(every, kind, args.epochs, args.min_left) and \
                        (ready or slot == 0):
                    try:
                        self.start_run(slot)
                    except Exception as exc:  # the API server through a fault: the next round
                        log(f"slot {slot}: create failed: {type(exc).__name__}: {str(exc)[:200]}")
            if now >= next_rss:
                next_rss = now + 15
                threading.Thread(target=self.sample_rss, daemon=True).start()
            if now >= end and drain_until is None:
                drain = args.drain if args.drain is not None else drain_seconds(
                    self.running(), every, args.epochs, args.stall_timeout + args.grace)
                drain_until = end + drain
                log(f"soak over; drain {drain:.0f} s for {[r.name for r in self.running()]}")
            if drain_until is not None and now > drain_until:
                log(f"drain over: {[n for n in self.current if n]} still running")
                break
            time.sleep(SAMPLE_EVERY_S)
        for thread in appliers:
            thread.join(timeout=args.stall_timeout + 120)
        for slot, name in enumerate(self.current):  # past the drain: recorded as they stand, then deleted
            if name in self.sweeps:
                sweep = self.sweeps[name]
                for point in [p for p in sweep.points if p in self.records and self.records[p].ended_at is None]:
                    self.finish(point, self.cluster.get_run(point), delete=False)
                sweep.phase = "still " + str(((self.cluster.custom().get_namespaced_custom_object(
                    GROUP, VERSION, self.cluster.namespace, SWEEPS, name).get("status")) or {}).get("phase"))
                self.finish_sweep(sweep)
            elif name:
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
        checks = verdicts(runs, self.applied, self.args.stall_timeout, self.args.grace, limit, self.rss,
                          list(self.sweeps.values()))
        figs = figures(self.applied)
        print(f"\n== chaos report: seed {self.args.seed}, {len(runs)} runs, {self.args.minutes} min, "
              f"{len(self.applied)} faults ({sum(a.took for a in self.applied)} took hold) ==")
        for run in runs:
            print(f"  {run.name} ({run.slot_kind}): {run.phase} epoch {run.epoch}, interruptions {run.interruptions}, "
                  f"history {run.history}, model {run.model_loaded or run.model_error or 'not loaded'}")
        for sweep in self.sweeps.values():
            print(f"  {sweep.name} (sweep of {sweep.points}): {sweep.phase}, recommended {sweep.recommended}")
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
        print(f"{broken} invariants broken; replay: bench/chaos.py --seed {self.args.seed} --slots {','.join(self.slots)} "
              f"--minutes {self.args.minutes} --faults {self.args.faults} --mix {mix_text(self.args.mix)}")
        if self.args.json:
            Path(self.args.json).write_text(json.dumps({
                "seed": self.args.seed, "runs": len(runs), "slots": self.slots, "minutes": self.args.minutes,
                "faults": [vars(a.fault) | {"run": a.run, "took": a.took, "why_not": a.why_not,
                                            "back_after": a.back_after, "redone": a.redone} for a in self.applied],
                "figures": figs, "invariants": {line: f for line, f in checks},
                "rss_peak": max(self.rss, default=0), "rss_limit": limit,
                "run_results": {r.name: [r.phase, r.epoch, r.interruptions, r.model_loaded or r.model_error]
                                for r in runs},
                "sweeps": {w.name: [w.phase, w.recommended] for w in self.sweeps.values()}}, indent=1))
        self.broken = broken


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
    parser.add_argument("--slots", type=parse_slots, default=None,
                        help="slot kinds in order, e.g. keras,lightning,elastic,keras,sweep (overrides --runs' cycle)")
    parser.add_argument("--min-left", type=float, default=None,
                        help="no new run with less of the soak left (s); default: as long as a run of its kind took")
    parser.add_argument("--drain", type=float, default=None,
                        help="s after the soak for the runs to end; default: their epochs left at their kind's "
                             "slowest pace, plus stallTimeout + grace")
    parser.add_argument("--json", default="", help="also write the report here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    args.runs = len(args.slots) if args.slots else args.runs
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
