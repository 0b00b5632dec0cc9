"""Logs that outlive the pods: the launcher runs mpirun as its child, passes its output through as it comes (so
`kubectl logs` is unchanged) and keeps a bounded copy, archived under `<runLocation>/logs/attempt-<n>/` when the
attempt ends, whichever way: success, failure, or SIGTERM (a deleted pod; forwarded to mpirun, whose ranks get
it, then the archive is written within the grace period). The copy is also written every FLUSH_SECONDS, so that
a launcher killed outright (its node lost, OOM) leaves most of its log. Names: scalingrun_api.logs.

Standard library at import: storage (pyarrow) is imported by the thread that writes, not before mpirun starts.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Optional

from scalingrun_api.logs import (
    ATTEMPT_RECORD, LAUNCHER_LOG, LAUNCHER_LOG_BYTES, LINE_BYTES, RANK_TAIL_BYTES, RANK_TAIL_LINES, RankLines,
    attempt_folder, attempt_number, rank_log,
)

FLUSH_SECONDS = 60.0
STOP_SECONDS = 10.0  # after a forwarded SIGTERM, how long mpirun has to stop its ranks before it is killed
# The final write within a pod's default grace period (30 s) after STOP_SECONDS; a periodic one, shorter.
FINAL_WRITE_SECONDS = 15.0
FLUSH_WRITE_SECONDS = 10.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Tail:
    """The last lines of a stream, at most `max_lines` and `max_bytes` (the newest kept)."""

    def __init__(self, max_bytes: int, max_lines: Optional[int] = None):
        self.lines: collections.deque[bytes] = collections.deque(maxlen=max_lines)
        self.max_bytes, self.size, self.dropped = max_bytes, 0, 0

    def add(self, line: bytes) -> None:
        if self.lines.maxlen is not None and len(self.lines) == self.lines.maxlen:
            self.size -= len(self.lines[0])  # the deque drops it on append
            self.dropped += len(self.lines[0])
        self.lines.append(line)
        self.size += len(line)
        while self.size > self.max_bytes and len(self.lines) > 1:
            gone = len(self.lines.popleft())
            self.size -= gone
            self.dropped += gone

    def text(self) -> bytes:
        return b"".join(self.lines)


class BoundedLog:
    """A command's log as lines: the last `max_bytes` of all of them, and each MPI rank's last lines (the pieces
    Open MPI's --tag-output marks `[1,<rank>]<stdout>:`, joined into lines without that tag: RankLines). Memory stays under about
    max_bytes + ranks x rank_bytes whatever the command writes. Thread-safe."""

    def __init__(self, max_bytes: int = LAUNCHER_LOG_BYTES, rank_lines: int = RANK_TAIL_LINES,
                 rank_bytes: int = RANK_TAIL_BYTES, line_bytes: int = LINE_BYTES):
        self._all = _Tail(max_bytes)
        self._ranks: dict[int, _Tail] = {}
        self._rank_limits = (rank_bytes, rank_lines)
        self.line_bytes = line_bytes
        self.total_bytes = 0  # every byte seen, kept or not
        self.version = 0  # grows with every line: tells a flush whether anything is new
        self._changed_ranks: set[int] = set()
        self._rank_lines = RankLines(line_bytes)
        self._lock = threading.Lock()

    def add(self, line: bytes) -> None:
        """One line (its newline included; a missing one is added). A line over `line_bytes` is cut."""
        with self._lock:
            self.total_bytes += len(line)
            if len(line) > self.line_bytes:
                line = line[:self.line_bytes] + b" [line cut]\n"
            elif not line.endswith(b"\n"):
                line += b"\n"
            self._all.add(line)
            self.version += 1
            for rank, text in self._rank_lines.feed(line):
                if rank not in self._ranks:
                    self._ranks[rank] = _Tail(*self._rank_limits)
                self._ranks[rank].add(text)
                self._changed_ranks.add(rank)

    @property
    def kept_bytes(self) -> int:
        return self._all.size

    def text(self) -> bytes:
        """The kept end, after a line saying how much came before it when some did not fit."""
        with self._lock:
            kept, dropped = self._all.text(), self._all.dropped
        if dropped:
            return f"[scalingrun: the first {dropped} bytes of this log are not kept; these are its last " \
                   f"{len(kept)}]\n".encode() + kept
        return kept

    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._ranks)

    def rank_text(self, rank: int) -> bytes:
        with self._lock:
            tail = self._ranks.get(rank)
            return tail.text() if tail else b""

    def take_changed_ranks(self) -> list[int]:
        """The ranks with lines since the last call."""
        with self._lock:
            changed, self._changed_ranks = sorted(self._changed_ranks), set()
            return changed


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _within(seconds: float, call: Callable[[], Any], who: str = "scalingrun-trainer launch") -> bool:
    """call() in a thread of its own, waited for at most `seconds` (a hung request must not hold the pod's exit).
    True when it finished in time without raising."""
    outcome: list[bool] = []

    def target() -> None:
        try:
            call()
            outcome.append(True)
        except Exception as exc:  # reported, never fatal: the training's exit code is what counts
            print(f"{who}: warning: cannot archive the log: {exc}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(outcome)


class AttemptArchive:
    """One attempt's log and where it goes: `<logs_uri>/attempt-<n>/` (n claimed at the first write)."""

    who = "scalingrun-trainer launch"  # how its own lines begin

    def __init__(self, logs_uri: str, log: Optional[BoundedLog] = None, pod: Optional[str] = None):
        self.logs_uri = logs_uri.rstrip("/")
        self.log = log or BoundedLog()
        self.record: dict[str, Any] = {"pod": pod or os.environ.get("HOSTNAME") or socket.gethostname(),
                                       "started": _now(), "state": "running"}
        self.number: Optional[int] = None
        self._folder: Any = None  # storage.Location of attempt-<n>/
        self._written_version = -1
        self._lock = threading.Lock()  # one write at a time: the periodic one, or the last

    def note(self, line: str, stream: IO[str] = sys.stderr) -> None:
        """A line of the launcher's own, on its stderr and in the log."""
        print(line, file=stream, flush=True)
        self.log.add(line.encode("utf-8", "replace") + b"\n")

    def _claim(self) -> None:
        """The next attempt number: one past the highest attempt-<n> under logs/, its attempt.json written at once so
        that the next launcher takes the number after it."""
        from pyarrow import fs as pafs

        from ..storage import open_location, retrying

        logs = open_location(self.logs_uri)
        selector = pafs.FileSelector(logs.path, allow_not_found=True)
        infos = retrying("list", logs.uri, lambda: logs.fs.get_file_info(selector), FLUSH_WRITE_SECONDS)
        taken = [attempt_number(info.base_name) for info in infos if info.type == pafs.FileType.Directory]
        self.number = max([n for n in taken if n] or [0]) + 1
        self._folder = logs.join(attempt_folder(self.number))
        self.record["attempt"] = self.number
        self._folder.join(ATTEMPT_RECORD).write_bytes_atomic(self._record_bytes(), FLUSH_WRITE_SECONDS)

    def _record_bytes(self) -> bytes:
        record = {**self.record, "logBytes": self.log.total_bytes, "keptBytes": self.log.kept_bytes,
                  "ranks": self.log.ranks()}
        return json.dumps(record, indent=2).encode()

    def write(self, deadline: float, final: bool = False) -> None:
        """The log, the changed ranks' tails and attempt.json, each retried until `deadline` seconds."""
        with self._lock:
            if self._folder is None:
                self._claim()
            if not final and self.log.version == self._written_version:
                return
            version = self.log.version
            self._folder.join(LAUNCHER_LOG).write_bytes_atomic(self.log.text(), deadline)
            changed = self.log.take_changed_ranks()
            for rank in self.log.ranks() if final else changed:  # the last write: all (an earlier one may have failed)
                self._folder.join(rank_log(rank)).write_bytes_atomic(self.log.rank_text(rank), deadline)
            self._folder.join(ATTEMPT_RECORD).write_bytes_atomic(self._record_bytes(), deadline)
            self._written_version = version

    def finish(self, exit_code: int, stopped_by: Optional[str] = None, seconds: float = FINAL_WRITE_SECONDS) -> bool:
        """The last write, with how the attempt ended; at most `seconds`. True when it was written."""
        self.record.update(ended=_now(), exitCode=exit_code, signal=stopped_by,
                           state="stopped" if stopped_by else "succeeded" if exit_code == 0 else "failed")
        written = _within(seconds, lambda: self.write(seconds, final=True), self.who)
        if written:
            print(f"{self.who}: log archived in {self.where()}", file=sys.stderr, flush=True)
        return written

    def where(self) -> str:
        return f"{self._folder.uri}/"

    def start_flushing(self, every: float = FLUSH_SECONDS) -> threading.Event:
        """Writes the log every `every` seconds (the first time at once: the claim) until the event is set."""
        stop = threading.Event()

        def flush() -> None:
            wait = 0.0
            while not stop.wait(wait):
                _within(FLUSH_WRITE_SECONDS * 3, lambda: self.write(FLUSH_WRITE_SECONDS), self.who)
                wait = every

        threading.Thread(target=flush, name="log-archive", daemon=True).start()
        return stop


class PodArchive(AttemptArchive):
    """A pod's log as one file, `<logs_uri>/<pod>.log`: the preprocessing pods (a new pod per try, no ranks)."""

    who = "scalingrun-trainer logged"

    def write(self, deadline: float, final: bool = False) -> None:
        from ..storage import open_location

        with self._lock:
            if self._folder is None:
                self._folder = open_location(self.logs_uri).join(f"{self.record['pod']}.log")
            if not final and self.log.version == self._written_version:
                return
            version = self.log.version
            self._folder.write_bytes_atomic(self.log.text(), deadline)
            self._written_version = version

    def where(self) -> str:
        return self._folder.uri


def _pump(source: IO[bytes], sink: IO[bytes], log: BoundedLog) -> None:
    """Every line of `source` to `sink` at once and into the log; lines longer than the log keeps are read in
    pieces (a line without a newline is never waited for beyond what the pipe holds)."""
    while True:
        line = source.readline(log.line_bytes)
        if not line:
            return
        try:
            sink.write(line)
            sink.flush()
        except (BrokenPipeError, ValueError):
            pass
        log.add(line)


def exit_code_of(returncode: int) -> int:
    """A shell's exit code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run_archived(command: list[str], archive: AttemptArchive, flush_every: float = FLUSH_SECONDS,
                 stop_seconds: float = STOP_SECONDS) -> int:
    """Runs `command` with its stdout and stderr passed through and kept in `archive`; SIGTERM, SIGINT and SIGHUP
    are forwarded to it (a second time, or `stop_seconds` after the first, it is killed). The archive is written
    when it ends, however it ends. Returns its exit code (a shell's: 128 + N for signal N)."""
    stopped: list[int] = []
    previous = {}

    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        archive.note(f"{archive.who}: error: cannot start {command[0]}: {exc.strerror or exc}")
        archive.finish(127)
        return 127

    def forward(number: int, _frame: Any) -> None:
        if process.poll() is None:
            process.send_signal(number if not stopped else signal.SIGKILL)
        stopped.append(number)

    for number in FORWARDED_SIGNALS:
        previous[number] = signal.signal(number, forward)
    pumps = [threading.Thread(target=_pump, args=(pipe, sink, archive.log), daemon=True)
             for pipe, sink in ((process.stdout, sys.stdout.buffer), (process.stderr, sys.stderr.buffer))]
    for pump in pumps:
        pump.start()
    flushing = archive.start_flushing(flush_every)
    kill_at: Optional[float] = None
    try:
        while process.poll() is None:
            try:
                process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if stopped and kill_at is None:
                kill_at = time.monotonic() + stop_seconds
            if kill_at is not None and time.monotonic() >= kill_at and process.poll() is None:
                process.kill()
        for pump in pumps:
            pump.join(2.0)  # a grandchild that keeps the pipe open must not hold the exit
    finally:
        flushing.set()
        for number, handler in previous.items():
            signal.signal(number, handler)
    code = exit_code_of(process.returncode)
    name = signal.Signals(stopped[0]).name if stopped else None
    if name:
        archive.note(f"{archive.who}: {name} received; {command[0]} ended with exit code {code}")
    archive.finish(code, name)
    return code
