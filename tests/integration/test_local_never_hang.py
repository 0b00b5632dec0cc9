"""`scalingrun run --local` never hangs and leaves nothing behind (issue 29, the local runner's side).

Each test runs the real CLI on a training.command under the real mpirun -np 2 (no framework: plain Python ranks),
on a dataset that is there already (no preprocessing):
- a rank that raises ends the run: the others are stopped, the run fails naming the rank and its error;
- SIGTERM, SIGINT and SIGHUP to the runner stop mpirun and every rank, and the runner exits 128 + the signal;
- no heartbeat for spec.training.stallTimeout stops the ranks and fails the run as Stalled (rank 0 pushes its
  heartbeat and final progress with the trainer's pusher, to the runner's status endpoint on 127.0.0.1, as the
  trainer does: the runner reads neither from storage);
and the quick start's SeaweedFS is stopped on SIGTERM too, so that the next one starts on the same data folder.
Every wait is on a cause (a file a rank writes, a line the runner prints, the runner's exit).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import psutil
import pytest
import yaml

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.locations import manifest_uri
from scalingrun_operator.decide.preprocessing import dataset_parameters
from tests.support.env import require

ROOT = Path(__file__).resolve().parents[2]

# Each rank notes its pid, then does what the test asks of its rank: "raise", "beat" (one heartbeat, then silence),
# "sleep" (for ever, as a rank blocked in a collective), or "stall once" (the first attempt beats once and goes
# silent; the next one finishes the run). Documents are pushed as the trainer pushes them (its own pusher, from the
# variables the runner sets); a mark says a push was answered.
RANK = """
import json, os, pathlib, sys, time
from scalingrun_trainer.core.status_push import status_pusher
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
marks = pathlib.Path(os.environ["MARKS"])
(marks / f"rank-{rank}.pid").write_text(str(os.getpid()))
todo = sys.argv[1 + rank]

def push(what, document):
    pusher = status_pusher()
    assert pusher is not None, "the runner set no status endpoint"
    pusher.push(what, document)
    assert pusher.flush(60), f"the {what} push was not answered"
    (marks / f"pushed-{what}").write_text("")

if todo == "raise":
    time.sleep(0.5)  # rank 0 is asleep by then
    raise IndexError("list index out of range (devices=1 under two ranks on one host)")
if todo == "stall once" and (marks / "attempt-1").exists():
    if rank == 0:
        push("progress", {"state": "succeeded", "epoch": 3, "maxEpochs": 3, "metrics": {"val_accuracy": 0.5},
                          "bestEpoch": 3, "bestMetrics": {"val_accuracy": 0.5}, "processes": 2})
    sys.exit(0)
if todo == "stall once" and rank == 0:
    (marks / "attempt-1").write_text("")
if todo == "beat" or (todo == "stall once" and rank == 0):
    push("heartbeat", {"phase": "training", "epoch": 2, "step": 7, "time": time.time(), "rank": 0})
time.sleep(3600)
"""


@pytest.fixture(autouse=True)
def mpirun() -> None:
    require(shutil.which("mpirun") is not None, "mpirun not found: scripts/setup.sh installs openmpi-bin")


def run_spec(root: Path, name: str, ranks: tuple[str, str], **training) -> dict:
    """A training.command run on a dataset that is there already; its manifest written as the preprocessing would."""
    script = root / "rank.py"
    script.write_text(RANK)
    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
            "spec": {"dataset": {"source": str(root / "raw"), "output": str(root / "data"), "imageSize": 32},
                     "training": {"command": [sys.executable, str(script), *ranks], "maxEpochs": 3, **training},
                     "workers": {"replicas": 2, "gpusPerWorker": 0}}}
    run = parse_scalingrun(spec)
    manifest = Path(manifest_uri(run))
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({
        "fingerprint": "f" * 16, "parameters": dataset_parameters(run), "source": run.spec.dataset.source,
        "classes": ["a", "b"], "shards": 1, "written": {"train": 8, "validation": 2}, "skipped": 0}))
    Path(root / "data" / "runs" / name).mkdir(parents=True)
    return spec


def start_runner(root: Path, spec: dict) -> subprocess.Popen:
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    (root / "marks").mkdir()
    return subprocess.Popen([sys.executable, "-m", "scalingrun_operator.cli", "run", "--local", "-f", str(path),
                             "--workdir", str(root / "work")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "MARKS": str(root / "marks"), "PYTHONUNBUFFERED": "1"})


def wait_for(found, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


def rank_pids(root: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted((root / "marks").glob("rank-*.pid")) if p.read_text()]


def named(processes: list) -> list[str]:
    """Their names ("" for one that has ended meanwhile)."""
    names = []
    for process in processes:
        try:
            names.append(process.name())
        except psutil.NoSuchProcess:
            names.append("")
    return names


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def finish(runner: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        out, err = runner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        runner.kill()
        out, err = runner.communicate()
        pytest.fail(f"the runner did not end within {timeout:.0f} s:\n{err[-3000:]}")
    return runner.returncode, out + err


def status(root: Path) -> dict:
    return json.loads((root / "work" / "status.json").read_text())


def failed_message(root: Path) -> str:
    document = status(root)
    assert document["phase"] == "Failed", document
    return next(c["message"] for c in document["conditions"] if c["type"] == "Failed")


def test_a_rank_that_raises_fails_the_run_with_its_error_and_stops_the_others(tmp_path):
    runner = start_runner(tmp_path, run_spec(tmp_path, "rank-raises", ("sleep", "raise")))
    started = time.monotonic()
    code, output = finish(runner)
    print(f"a rank that raised at start-up: the local run failed {time.monotonic() - started:.1f} s after its start")
    assert code == 1, output[-3000:]
    message = failed_message(tmp_path)
    assert "rank 1 exited with code 1: IndexError: list index out of range" in message, message
    assert "the other ranks were stopped" in message
    assert (tmp_path / "work/logs/rank-raises-train").is_dir()  # each rank's own log, quoted above
    pids = rank_pids(tmp_path)
    assert len(pids) == 2 and not [pid for pid in pids if running(pid)], "a rank outlived the run"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_runner_stops_mpirun_and_every_rank(tmp_path, signum):
    runner = start_runner(tmp_path, run_spec(tmp_path, "stopped", ("sleep", "sleep")))
    wait_for(lambda: len(rank_pids(tmp_path)) == 2, "two ranks")
    below = psutil.Process(runner.pid).children(recursive=True)
    assert "mpirun" in named(below), named(below)
    sent = time.monotonic()
    runner.send_signal(signum)
    code, output = finish(runner)
    print(f"{signal.Signals(signum).name}: the runner and its {len(below)} processes ended "
          f"{time.monotonic() - sent:.1f} s after the signal")
    assert code == 128 + signum, output[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in output
    left = [p for p in below if p.is_running() and running(p.pid)]
    assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"
    assert not [pid for pid in rank_pids(tmp_path) if running(pid)]


def test_no_heartbeat_for_the_stall_timeout_stops_the_ranks_and_fails_the_run_as_stalled(tmp_path):
    runner = start_runner(tmp_path, run_spec(tmp_path, "stalls", ("beat", "sleep"), stallTimeout="3s", onStall="fail"))
    wait_for((tmp_path / "marks/pushed-heartbeat").exists, "heartbeat pushed")
    beat = time.monotonic()
    code, output = finish(runner)
    print(f"a run that beat once, then went quiet (stallTimeout 3 s): Failed as Stalled "
          f"{time.monotonic() - beat:.1f} s after the beat")
    assert code == 1, output[-3000:]
    message = failed_message(tmp_path)
    assert "(Stalled: no heartbeat for" in message and "stallTimeout 3 s" in message, message
    assert "the last was epoch 2, step 7 (training) from rank 0" in message
    assert "the ranks were stopped (onStall is fail)" in message
    assert not [pid for pid in rank_pids(tmp_path) if running(pid)]
    assert not (tmp_path / "data/runs/stalls/heartbeat.json").exists()  # judged on the pushed heartbeat alone


def test_on_stall_restart_starts_the_ranks_again_and_the_run_goes_on(tmp_path):
    runner = start_runner(tmp_path, run_spec(tmp_path, "restarts", ("stall once", "stall once"), stallTimeout="3s"))
    code, output = finish(runner)
    assert code == 0, output[-3000:]
    assert status(tmp_path)["phase"] == "Succeeded"
    assert status(tmp_path)["training"]["epoch"] == 3  # the pushed progress: storage has no progress.json
    assert not (tmp_path / "data/runs/restarts/progress.json").exists()
    assert "the ranks were stopped and start again (onStall restart, 1 of maxInterruptions 10)" in output


def test_a_run_that_keeps_stalling_fails_once_max_interruptions_are_used_up(tmp_path):
    runner = start_runner(tmp_path, run_spec(tmp_path, "keeps-stalling", ("beat", "sleep"), stallTimeout="2s",
                                             maxInterruptions=1))
    code, output = finish(runner)
    assert code == 1, output[-3000:]
    assert output.count("start again (onStall restart") == 1
    assert "the ranks were stopped (maxInterruptions (1) used up)" in failed_message(tmp_path)
    assert not [pid for pid in rank_pids(tmp_path) if running(pid)]


def test_sigterm_to_the_quick_start_stops_its_seaweedfs_and_the_next_one_starts(tmp_path):
    from scalingrun_operator.local.s3server import S3Server, weed_binary

    try:
        weed_binary()
    except RuntimeError as exc:
        require(False, str(exc))
    state = tmp_path / "state"
    quickstart = subprocess.Popen([sys.executable, "-m", "scalingrun_operator.local.quickstart", "--state", str(state),
                                   "-f", str(ROOT / "examples/quickstart.yaml"), "--per-class", "10"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    weed = _wait_for_line(quickstart, "S3 server (SeaweedFS) on ")
    assert weed is not None, "the quick start printed no SeaweedFS line"
    below = psutil.Process(quickstart.pid).children(recursive=True)
    servers = [p for p, name in zip(below, named(below)) if name == "weed"]
    assert servers, named(below)
    quickstart.send_signal(signal.SIGTERM)
    out, _ = quickstart.communicate(timeout=120)
    assert quickstart.returncode == 143, out[-3000:]
    assert not [p for p in servers if p.is_running() and running(p.pid)]
    keys = json.loads((state / "credentials.json").read_text())
    server = S3Server(state / "seaweedfs", keys["accessKey"], keys["secretKey"]).start()  # the folder is free
    server.stop()


def _wait_for_line(process: subprocess.Popen, text: str) -> Optional[str]:
    for line in process.stdout:
        if text in line:
            return line
    return None
