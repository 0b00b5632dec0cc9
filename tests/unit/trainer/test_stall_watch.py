"""The stall watch (core/stall.py) on a real (local) filesystem: the roll call names the ranks that did not
answer, the watch stops its rank when the loop stops beating, and the engines' own timeouts come after it."""

from __future__ import annotations

import threading

import pytest

from scalingrun_trainer.core.heartbeat import HeartbeatWriter
from scalingrun_trainer.core.stall import (
    STALL_EXIT_CODE, TIMEOUT_VARIABLE, StallWatch, StallWatchError, collective_timeout, engine_timeout,
    roll_call_window,
)
from scalingrun_trainer.storage import open_location


def watch(tmp_path, rank: int = 0, size: int = 3, timeout: float = 1.0, **kwargs) -> StallWatch:
    heartbeat = HeartbeatWriter(None, rank=rank)
    heartbeat.beat("training", step=12, epoch=1)
    return StallWatch(heartbeat, open_location(str(tmp_path / "stalls" / "attempt")), rank=rank, size=size,
                      timeout=timeout, **kwargs)


def test_the_roll_call_names_the_ranks_that_did_not_answer(tmp_path):
    watch(tmp_path, rank=2, window=0).roll_call(1.0)  # rank 2 answered earlier; rank 1 never does
    line = watch(tmp_path, rank=0, window=0.5).roll_call(301.0)
    assert "rank 0/3" in line and "no training step for 301 s" in line and "epoch 1, step 12" in line
    assert "rank 1 stopped answering" in line and "rank 2" not in line.split("):")[-1]


def test_when_every_rank_answers_none_is_called_frozen(tmp_path):
    watch(tmp_path, rank=1, size=2, window=0).roll_call(1.0)
    line = watch(tmp_path, rank=0, size=2, window=5).roll_call(300.0)  # returns as soon as all answered
    assert "every rank answered the roll call" in line


def test_the_watch_stops_its_rank_when_the_loop_stops_beating(tmp_path):
    exited, lines = threading.Event(), []
    codes = []
    stalled = watch(tmp_path, size=2, timeout=1.0, window=0.5, log=lines.append,
                    exit=lambda code: (codes.append(code), exited.set()))
    stalled.arm()
    assert exited.wait(60), "the watch did not stop the rank"
    assert codes == [STALL_EXIT_CODE] and "rank 1 stopped answering" in lines[0]


def test_a_disarmed_watch_ends_without_stopping_the_rank(tmp_path):
    codes = []
    quiet = watch(tmp_path, size=2, timeout=30.0, exit=codes.append)
    quiet.arm()
    quiet.disarm()
    quiet._thread.join(30)
    assert not quiet._thread.is_alive() and codes == []


def test_the_engines_own_timeouts_come_after_the_watch_and_its_roll_call(monkeypatch):
    monkeypatch.delenv(TIMEOUT_VARIABLE, raising=False)
    assert collective_timeout() == 300 and engine_timeout() == 300 + roll_call_window(300) + 30 == 390
    monkeypatch.setenv(TIMEOUT_VARIABLE, "15")
    assert engine_timeout() == 15 + 10 + 30
    monkeypatch.setenv(TIMEOUT_VARIABLE, "0")
    assert engine_timeout() is None
    monkeypatch.setenv(TIMEOUT_VARIABLE, "five minutes")
    with pytest.raises(StallWatchError, match=TIMEOUT_VARIABLE):
        collective_timeout()


def test_every_horovod_mpijob_gets_the_trainers_stall_shutdown():
    from scalingrun_api.engines import HOROVOD_STALL_ENV, horovod_stall_env

    assert HOROVOD_STALL_ENV == horovod_stall_env(engine_timeout(300)) == {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "390",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "390"}
    assert horovod_stall_env(engine_timeout(0)) == {}  # the watch off: Horovod's own defaults


def test_a_rank_that_was_itself_frozen_says_so_instead_of_calling_the_roll(tmp_path):
    class Jumping:
        """A monotonic clock that jumps a minute forward after the first reads, as a SIGSTOPped process sees it."""

        def __init__(self):
            self.reads = 0

        def __call__(self) -> float:
            self.reads += 1
            return 100.0 if self.reads <= 2 else 160.0

    exited, lines, clock = threading.Event(), [], Jumping()
    heartbeat = HeartbeatWriter(None, rank=1, monotonic=clock)
    heartbeat.beat("training", step=3, epoch=0)
    frozen = StallWatch(heartbeat, open_location(str(tmp_path / "stalls")), rank=1, size=2, timeout=5.0,
                        monotonic=clock, log=lines.append, exit=lambda code: exited.set())
    frozen.arm()
    assert exited.wait(60)
    assert "rank 1/2): this process was stopped for 60 s" in lines[0]
    assert not (tmp_path / "stalls").exists()  # no roll call: the others already know


def test_tensorflows_own_detection_names_the_silent_worker_as_its_rank():
    from scalingrun_trainer.core.stall import silent_peer

    error = RuntimeError("Collective ops is aborted by: Error reported from /job:worker/task:1: Task "
                         "/job:worker/replica:0/task:1 heartbeat timeout. This indicates that the remote task "
                         "has failed")
    assert silent_peer(error) == 1
    assert silent_peer(RuntimeError("Timed out waiting 10000ms for recv operation to complete")) is None
