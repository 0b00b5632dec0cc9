"""The local runner's reading of a training's end: which rank failed, as mpirun and horovodrun say it, with the
rank's own last lines; and when no heartbeat for the stall timeout means Stalled."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalingrun_operator.documents import parse_heartbeat
from scalingrun_operator.local.process_tree import ProcessTree
from scalingrun_operator.local.training import StallWatch, TrainingProcess, with_rank_logs

MPIRUN = """--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[13319,1],1]
  Exit code:    1
--------------------------------------------------------------------------"""
HOROVODRUN = """RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the \
job to be terminated. The first process to do so was:
Process name: 1
Exit code: 3"""
SIGNALLED = "mpirun noticed that process rank 0 with PID 4242 on node host-1 exited on signal 9 (Killed)."
TRACEBACK = """Traceback (most recent call last):
  File "train.py", line 7, in <module>
    raise IndexError("list index out of range")
IndexError: list index out of range
"""


def ended(logs: Path, launcher_said: str) -> TrainingProcess:
    training = TrainingProcess(None, logs, ProcessTree([]))
    training.tail.extend(["epoch 1/3: loss 2.1", *launcher_said.splitlines()])
    return training


def test_mpiruns_account_names_the_rank_and_its_error_from_its_own_log(tmp_path):
    (tmp_path / "1/rank.1").mkdir(parents=True)
    (tmp_path / "1/rank.1/stderr").write_text(TRACEBACK)
    message = ended(tmp_path, MPIRUN).failure_message(1)
    assert message == (f"rank 1 exited with code 1: IndexError: list index out of range (its log: "
                       f"{tmp_path}/1/rank.1/stderr); the other ranks were stopped")


def test_horovodruns_account_and_its_tagged_padded_log(tmp_path):
    (tmp_path / "rank.01").mkdir()
    (tmp_path / "rank.01/stderr").write_text("".join(f"[1]<stderr>:{line}\n" for line in TRACEBACK.splitlines()))
    training = ended(tmp_path, HOROVODRUN)
    assert training.failed_rank() == (1, "exited with code 3")
    assert training.rank_lines(1)[-1] == "IndexError: list index out of range"


def test_a_rank_killed_by_a_signal_and_a_launcher_that_named_none(tmp_path):
    assert ended(tmp_path, SIGNALLED).failure_message(137).startswith("rank 0 was killed by signal 9; the other")
    assert ended(tmp_path, "Killed").failure_message(2) == "the training exited with code 2"


def test_mpirun_and_horovodrun_keep_each_ranks_log_and_other_commands_run_as_they_are(tmp_path):
    assert with_rank_logs(["/usr/bin/mpirun", "-np", "2", "python"], tmp_path) == [
        "/usr/bin/mpirun", "--output-filename", str(tmp_path), "-np", "2", "python"]
    assert with_rank_logs(["python", "-c", "pass"], tmp_path) == ["python", "-c", "pass"]
    # Horovod 0.28.1's horovodrun fails on --output-filename with one process (log10 of 0): left as it is.
    single = ["/venv/bin/horovodrun", "-np", "1", "-H", "localhost:1", "--gloo", "python"]
    assert with_rank_logs(single, tmp_path) == single
    assert with_rank_logs([*single[:2], "2", *single[3:]], tmp_path)[1:3] == ["--output-filename", str(tmp_path)]


RAW_BEAT = {"phase": "training", "epoch": 2, "step": 7, "time": 1000.0, "longestGapSeconds": 40.0, "rank": 0}
BEAT = parse_heartbeat(RAW_BEAT)


@pytest.mark.parametrize("setting, now, stalled", [
    ("3s", 1002.0, False),     # fresh
    ("3s", 1004.0, True),      # older than the timeout
    (0, 99999.0, False),       # 0: off
    ("auto", 1599.0, False),   # auto: the 10 min floor (3 x 40 s is less)
    ("auto", 1601.0, True),
])
def test_the_stall_timeout(setting, now, stalled):
    message = StallWatch(setting, started=990.0).stalled(BEAT, now=now)
    assert (message is not None) == stalled
    if stalled:
        assert message.startswith(f"no heartbeat for {now - 1000:.0f} s") and "epoch 2, step 7 (training)" in message


def test_auto_grows_with_the_longest_gap_and_an_earlier_attempts_beat_or_none_is_no_stall():
    slow = parse_heartbeat({**RAW_BEAT, "longestGapSeconds": 300.0})
    assert StallWatch("auto", started=990.0).stalled(slow, now=1000.0 + 899) is None  # 3 x 300 s
    assert StallWatch("auto", started=990.0).stalled(slow, now=1000.0 + 901) is not None
    assert StallWatch("3s", started=5000.0).stalled(BEAT, now=9999.0) is None  # the beat is from before this attempt
    assert StallWatch("3s", started=990.0).stalled(None, now=9999.0) is None
