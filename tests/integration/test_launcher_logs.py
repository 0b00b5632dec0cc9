"""The launcher archives each attempt's log in the run's storage when the attempt ends: the real
`scalingrun-trainer launch --logs` process, a real `mpirun -np 2 --tag-output` of a small script, real SeaweedFS.
The workers' sshd is a loopback listener that speaks an SSH banner (tests/support/launcher.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from scalingrun_api.logs import AttemptRecord, RankLines
from tests.support.env import ROOT, require
from tests.support.launcher import SSH_HOST, port, tcp_server, write_hostfile  # noqa: F401 (port: a fixture)

pytestmark = pytest.mark.s3

BANNER = b"SSH-2.0-test\r\n"
POD = "demo-train-launcher-abcde"  # the pod's name, its hostname
RANK_SCRIPT = """
import os, sys, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
for line in range(int(sys.argv[1])):
    print(f"rank {rank} line {line}", flush=True)
print(f"rank {rank} to stderr", file=sys.stderr, flush=True)
if sys.argv[2] == "sleep":
    print(f"rank {rank} sleeping", flush=True)
    time.sleep(600)
# Only the last rank fails: had rank 0 failed first, mpirun would abort rank 1, maybe before its lines were out.
sys.exit(int(sys.argv[2]) if rank == "1" else 0)
"""


@pytest.fixture
def mpirun() -> list[str]:
    found = shutil.which("mpirun")
    require(found is not None, "mpirun not found: scripts/setup.sh installs openmpi-bin")
    return [found, *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2", "-bind-to", "none",
            "--oversubscribe", "--tag-output"]


@pytest.fixture
def logs_uri(s3_server) -> str:
    bucket = f"launcher-logs-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/runs/demo/logs"


def launcher(hostfile: str, port: int, logs: str, command: list[str], timeout: int = 20) -> list[str]:
    return [sys.executable, "-m", "scalingrun_trainer.cli", "launch", "--hostfile", hostfile, "--ssh-port",
            str(port), "--timeout", str(timeout), "--logs", logs, "--", *command]


def environment(s3_server) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "trainer"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, **s3_server.env(), "PYTHONPATH": path, "HOSTNAME": POD}


def ranks_lines(log: bytes) -> list[tuple[int, bytes]]:
    pieces = RankLines()
    return [pair for line in log.splitlines(keepends=True) for pair in pieces.feed(line)]


def read(s3_server, logs: str, name: str) -> bytes:
    with s3_server.filesystem().open_input_stream(f"{logs[len('s3://'):]}/{name}") as stream:
        return stream.read()


def record(s3_server, logs: str, attempt: int) -> AttemptRecord:
    return AttemptRecord.model_validate(json.loads(read(s3_server, logs, f"attempt-{attempt}/attempt.json")))


def two_ranks(tmp_path) -> tuple[str, Path]:
    """A hostfile of one worker with two slots, and the ranks' script (RANK_SCRIPT)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    return write_hostfile(tmp_path, [f"{SSH_HOST} slots=2"]), script


def test_each_attempt_archives_the_launcher_log_and_every_ranks_last_lines(tmp_path, port, mpirun, s3_server,
                                                                           logs_uri):
    hostfile, script = two_ranks(tmp_path)
    with tcp_server(SSH_HOST, port, BANNER):
        ok = subprocess.run(launcher(hostfile, port, logs_uri, [*mpirun, sys.executable, str(script), "300", "0"]),
                            capture_output=True, env=environment(s3_server), timeout=300)
        failed = subprocess.run(launcher(hostfile, port, logs_uri, [*mpirun, sys.executable, str(script), "3", "4"]),
                                capture_output=True, env=environment(s3_server), timeout=300)
    assert ok.returncode == 0, ok.stderr.decode()[-3000:]
    # The output passes through as it came (what kubectl logs shows), and the archive holds the same bytes.
    assert (1, b"rank 1 line 299\n") in ranks_lines(ok.stdout)
    assert f"log archived in {logs_uri}/attempt-1/".encode() in ok.stderr
    log = read(s3_server, logs_uri, "attempt-1/launcher.log")
    assert set(ok.stdout.splitlines()) <= set(log.splitlines()) and set(ok.stderr.splitlines()[:-1]) <= set(log.splitlines())
    for rank in (0, 1):
        assert (rank, f"rank {rank} line 299\n".encode()) in ranks_lines(log)
        assert (rank, f"rank {rank} to stderr\n".encode()) in ranks_lines(log)
    assert b"scalingrun-trainer launch: all 1 workers answer ssh after" in log  # the launcher's own lines too
    # Each rank's last 200 lines, untagged.
    rank1 = read(s3_server, logs_uri, "attempt-1/rank-1.log").decode().splitlines()
    # (stdout and stderr reach the launcher through two pipes: their order is not kept, so the stderr line may
    # come before the last 200; attempt 2, with 4 lines a rank, shows that stderr reaches the rank's tail)
    assert len(rank1) == 200 and rank1[-1] in ("rank 1 line 299", "rank 1 to stderr")
    assert "rank 1 line 99" not in rank1 and not any("rank 0" in line for line in rank1)
    first = record(s3_server, logs_uri, 1)
    assert (first.state, first.exit_code, first.signal, first.ranks) == ("succeeded", 0, None, [0, 1])
    assert first.pod == POD and first.ended and first.kept_bytes == first.log_bytes > 0

    # The next launcher takes the next number; its failure is recorded with mpirun's exit code.
    assert failed.returncode != 0
    second = record(s3_server, logs_uri, 2)
    assert (second.state, second.exit_code) == ("failed", failed.returncode)
    assert (0, b"rank 0 line 2\n") in ranks_lines(read(s3_server, logs_uri, "attempt-2/launcher.log"))
    assert {"rank 1 line 0", "rank 1 line 1", "rank 1 line 2", "rank 1 to stderr"} <= set(
        read(s3_server, logs_uri, "attempt-2/rank-1.log").decode().splitlines())


def test_a_deleted_launcher_pods_sigterm_stops_mpirun_and_still_archives(tmp_path, port, mpirun, s3_server,
                                                                         logs_uri):
    hostfile, script = two_ranks(tmp_path)
    with tcp_server(SSH_HOST, port, BANNER):
        process = subprocess.Popen(launcher(hostfile, port, logs_uri, [*mpirun, sys.executable, str(script), "5",
                                                                        "sleep"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment(s3_server))
        try:
            seen = set()
            pieces = RankLines()
            for line in process.stdout:  # both ranks are up and asleep: the cause to wait on
                seen |= {rank for rank, text in pieces.feed(line) if text.endswith(b"sleeping\n")}
                if len(seen) == 2:
                    break
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert code != 0
    attempt = record(s3_server, logs_uri, 1)
    assert (attempt.state, attempt.signal, attempt.exit_code) == ("stopped", "SIGTERM", code)
    log = read(s3_server, logs_uri, "attempt-1/launcher.log")
    assert (1, b"rank 1 sleeping\n") in ranks_lines(log)
    assert b"scalingrun-trainer launch: SIGTERM received; " in log


def test_workers_that_never_answer_leave_a_failed_attempt_with_the_reason(tmp_path, port, s3_server, logs_uri):
    hostfile = write_hostfile(tmp_path, ["127.0.0.3 slots=1"])  # nothing listens there
    result = subprocess.run(launcher(hostfile, port, logs_uri, ["true"], timeout=1),
                            capture_output=True, env=environment(s3_server), timeout=120)
    assert result.returncode == 3
    attempt = record(s3_server, logs_uri, 1)
    assert (attempt.state, attempt.exit_code) == ("failed", 3)
    assert b"error: 1 of 1 workers not reachable over ssh after 1 s" in read(s3_server, logs_uri,
                                                                             "attempt-1/launcher.log")


def test_a_preprocessing_pods_command_leaves_its_log_and_exit_code(tmp_path, s3_server, logs_uri):
    """`scalingrun-trainer logged`, the preprocessing pods' wrapper: the log as <pod>.log, the exit code kept."""
    command = [sys.executable, "-c", "import sys; [print(f'shard 0: image {i}') for i in range(3)]; "
               "print('undecodable: a.jpg', file=sys.stderr); sys.exit(4)"]
    preprocess = f"{logs_uri}/preprocess"
    result = subprocess.run([sys.executable, "-m", "scalingrun_trainer.cli", "logged", "--logs", preprocess, "--",
                             *command], capture_output=True, env=environment(s3_server), timeout=120)
    assert result.returncode == 4
    assert result.stdout == b"shard 0: image 0\nshard 0: image 1\nshard 0: image 2\n"
    assert result.stderr.startswith(b"undecodable: a.jpg\n")
    log = read(s3_server, preprocess, f"{POD}.log")
    assert set(log.splitlines()) == {b"shard 0: image 0", b"shard 0: image 1", b"shard 0: image 2",
                                     b"undecodable: a.jpg"}
