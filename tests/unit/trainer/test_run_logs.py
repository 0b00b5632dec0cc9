"""The archived logs' bounds and names: what the launcher keeps of a log whatever it writes, how Open MPI's tagged
pieces become each rank's lines, and the names the launcher writes and `scalingrun logs` reads."""

from __future__ import annotations

import shlex

from scalingrun_api.logs import (
    LAUNCHER_LOG_BYTES, RANK_TAIL_LINES, AttemptRecord, RankLines, attempt_folder, attempt_number, rank_log, rank_of,
)
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_children
from scalingrun_operator.cli.logs import of_rank
from scalingrun_trainer.cli import build_parser
from scalingrun_trainer.launch.run_logs import BoundedLog, exit_code_of
from tests.support.specs import run_document


def test_attempt_and_rank_names_round_trip_and_nothing_else_is_taken_for_them():
    assert [attempt_folder(n) for n in (1, 12)] == ["attempt-1", "attempt-12"]
    assert [attempt_number(name) for name in ("attempt-1", "attempt-12/", "attempt-0", "attempt-01", "attempt-x",
                                              "_tmp-attempt-3", "attempt-3.json")] == [1, 12, None, None, None, None,
                                                                                       None]
    assert rank_log(7) == "rank-7.log" and [rank_of(n) for n in ("rank-0.log", "rank-7.log", "rank-07.log",
                                                                  "launcher.log")] == [0, 7, None, None]


def test_the_log_keeps_its_last_bytes_and_says_how_much_came_before():
    log = BoundedLog(max_bytes=1000)
    for index in range(500):
        log.add(f"line {index:04d}\n".encode())  # 10 bytes each: 5,000 in all
    text = log.text()
    header, *kept = text.decode().splitlines()
    assert header == "[scalingrun: the first 4000 bytes of this log are not kept; these are its last 1000]"
    assert kept == [f"line {index:04d}" for index in range(400, 500)]
    assert (log.total_bytes, log.kept_bytes) == (5000, 1000)


def test_the_default_bound_holds_whatever_is_written():
    log = BoundedLog()
    line = b"x" * 4000 + b"\n"
    for _ in range(1000):  # 4 MB
        log.add(line)
    assert LAUNCHER_LOG_BYTES - len(line) < log.kept_bytes <= LAUNCHER_LOG_BYTES
    assert len(log.text()) < LAUNCHER_LOG_BYTES + 200


def test_a_huge_line_is_cut_and_a_missing_newline_added():
    log = BoundedLog(line_bytes=100)
    log.add(b"y" * 500)
    log.add(b"no newline")
    assert log.text() == b"y" * 100 + b" [line cut]\n" + b"no newline\n"


def test_each_ranks_tail_holds_its_last_lines_without_tags():
    log = BoundedLog()
    for index in range(RANK_TAIL_LINES + 50):
        log.add(f"[1,0]<stdout>:epoch {index}\n".encode())
        log.add(f"[1,1]<stderr>:warning {index}\n".encode())
    log.add(b"scalingrun-trainer launch: not a rank's\n")
    assert log.ranks() == [0, 1]
    rank0 = log.rank_text(0).decode().splitlines()
    assert len(rank0) == RANK_TAIL_LINES and rank0[0] == "epoch 50" and rank0[-1] == f"epoch {RANK_TAIL_LINES + 49}"
    assert log.rank_text(1).decode().splitlines()[-1] == f"warning {RANK_TAIL_LINES + 49}"
    assert log.take_changed_ranks() == [0, 1] and log.take_changed_ranks() == []


def test_rank_tails_are_bounded_in_bytes_too():
    log = BoundedLog(rank_bytes=1000)
    for index in range(100):
        log.add(b"[1,3]<stdout>:" + b"z" * 99 + b"\n")
    assert len(log.rank_text(3)) == 1000


def test_open_mpis_pieces_are_joined_into_each_ranks_lines():
    pieces = RankLines()
    # As Open MPI 4.1 writes them (seen with mpirun -np 2 --tag-output of Python prints): a tag before the newline,
    # and one rank's line cut by the other's.
    got = []
    for line in [b"[1,0]<stdout>:epoch 1[1,0]<stdout>:\n",
                 b"[1,1]<stdout>:epoch 1 of rank[1,0]<stdout>:epoch 2\n",
                 b"mpirun noticed something\n",
                 b"[1,1]<stderr>:a warning\n",
                 b"[1,1]<stdout>: 1\n"]:
        got += pieces.feed(line)
    assert got == [(0, b"epoch 1\n"), (0, b"epoch 2\n"), (1, b"a warning\n"), (1, b"epoch 1 of rank 1\n")]


def test_scalingrun_logs_rank_filter_reads_the_live_launcher_log_the_same_way():
    live = [b"scalingrun-trainer launch: starting mpirun\n", b"[1,0]<stdout>:a[1,0]<stdout>:\n",
            b"[1,1]<stdout>:b\n", b"[1,0]<stderr>:c\n"]
    assert list(of_rank(iter(live), 0)) == [b"a\n", b"c\n"]
    assert list(of_rank(iter(live), None)) == live


def test_an_attempt_record_reads_what_the_launcher_writes():
    record = AttemptRecord.model_validate({"attempt": 2, "pod": "p", "started": "2026-11-25T23:00:00Z",
                                           "ended": "2026-11-25T23:10:00Z", "state": "stopped", "exitCode": 143,
                                           "signal": "SIGTERM", "logBytes": 10, "keptBytes": 10, "ranks": [0, 1],
                                           "later": "ignored"})
    assert (record.exit_code, record.signal, record.ranks) == (143, "SIGTERM", [0, 1])


def test_signals_read_as_a_shell_reads_them():
    assert [exit_code_of(code) for code in (0, 1, -15, -9)] == [0, 1, 143, 137]


def test_the_launcher_archives_under_the_runs_location_with_every_rank_tagged():
    run = parse_scalingrun(run_document(dataset={"output": "s3://bucket/parquet"}))
    launcher = build_children(run, "ml")[2]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    argv = shlex.split(launcher["command"][-1])[1:]
    args = build_parser().parse_args(argv[1:])  # the trainer's own CLI takes the line
    assert args.logs == "s3://bucket/parquet/runs/demo/logs"
    assert args.command_line[1] == "mpirun" and "--tag-output" in args.command_line
    explicit = parse_scalingrun(run_document(training={"checkpoint": {"location": "s3://other/run-7/"}}))
    launcher = build_children(explicit, "ml")[2]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert "--logs s3://other/run-7/logs " in launcher["containers"][0]["command"][-1]
