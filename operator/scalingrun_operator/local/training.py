"""The training of a local run as processes: mpirun (or horovodrun) and its ranks, what each rank wrote, which
rank ended the run and why, and the heartbeat that tells a slow run from a stalled one.

mpirun ends the job when a rank exits non-zero, and so does horovodrun; a rank that raised but cannot exit
(mpi4py's MPI_Finalize waiting for the other ranks, a reader's thread that is not a daemon) is the SDK's to end
(sdk/session.py), and a rank that only hangs is caught by the stall timeout. Each rank's output also goes to
`<workdir>/logs/<run>-train/` (mpirun's and horovodrun's --output-filename), so that the failure can quote the
rank's own last lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from scalingrun_api.engines import HOROVODRUN, MPIRUN
from scalingrun_api.heartbeat import Heartbeat, stall_timeout_seconds
from .process_tree import STOP_GRACE_SECONDS, ProcessTree

RANK_LOG_LINES = 6  # the failed rank's last lines quoted in the Failed message
_TAIL_LINES = 400  # mpirun's stderr kept to find which rank failed
_PROCESS_NAME = re.compile(r"Process name:\s*\S*?(\d+)\]*\s*$")  # mpirun [[13319,1],1]; horovodrun 1
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_RANK_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
_RANK_TAG = re.compile(r"^\[\d+\]<std(?:out|err)>:")  # horovodrun's prefix, in its files too
_LAUNCHERS = (MPIRUN, HOROVODRUN)


def with_rank_logs(command: list[str], folder: Path) -> list[str]:
    """The command with --output-filename after mpirun or horovodrun (each rank's stdout and stderr in a file of
    its own, still shown here too); any other command as it is. Not for horovodrun -np 1: Horovod 0.28.1 pads the
    rank in the file names by log10(np - 1), which fails for one process (and one rank needs no split)."""
    name = Path(command[0]).name if command else ""
    if name == HOROVODRUN and _option(command, "-np") == "1":
        return command
    if name in _LAUNCHERS:
        return [command[0], "--output-filename", str(folder), *command[1:]]
    return command


def _option(command: list[str], flag: str) -> Optional[str]:
    return command[command.index(flag) + 1] if flag in command[:-1] else None


@dataclass
class TrainingProcess:
    process: subprocess.Popen
    logs: Path
    tree: ProcessTree
    tail: deque = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))
    relay: Optional[threading.Thread] = None

    @classmethod
    def start(cls, command: list[str], env: dict[str, str], logs: Path) -> "TrainingProcess":
        """Starts the command in a session of its own: a Ctrl-C in the terminal reaches the runner only, which
        then stops the whole tree in order (mpirun would otherwise die first and leave its ranks)."""
        logs.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(with_rank_logs(command, logs), env=env, stderr=subprocess.PIPE, text=True,
                                   errors="replace", start_new_session=True)
        training = cls(process, logs, ProcessTree([process]))
        training.relay = threading.Thread(target=training._relay, daemon=True, name="scalingrun-training-stderr")
        training.relay.start()
        return training

    def _relay(self) -> None:
        shown = True
        for line in self.process.stderr:  # read to the end even when it cannot be shown: a full pipe blocks mpirun
            self.tail.append(line.rstrip("\n"))
            if shown:
                try:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                except (OSError, ValueError):  # our stderr closed (a pipe into `head`)
                    shown = False

    def wait(self, timeout: float) -> Optional[int]:
        """The exit code, or None while it runs after `timeout` s. Once the launcher has ended, any rank it left
        is stopped too."""
        self.tree.note()
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.tree.stop(grace=STOP_GRACE_SECONDS)
        if self.relay is not None:
            self.relay.join(timeout=5)
        return code

    def stop(self) -> int:
        """Stops the launcher and every rank (SIGTERM, then SIGKILL); how many processes were running."""
        stopped = self.tree.stop()
        if self.relay is not None:
            self.relay.join(timeout=5)
        return stopped

    # --- why it ended ----------------------------------------------------------------------------------

    def failed_rank(self) -> Optional[tuple[int, str]]:
        """(rank, "exited with code N" or "was killed by signal N") of the first rank that failed, as mpirun or
        horovodrun said it; None when they named none."""
        lines = list(self.tail)
        for index, line in enumerate(lines):
            named = _PROCESS_NAME.search(line)
            if named:
                code = next((m.group(1) for m in map(_EXIT_CODE.search, lines[index + 1:index + 3]) if m), None)
                return int(named.group(1)), f"exited with code {code}" if code is not None else "failed"
            signalled = _RANK_SIGNAL.search(line)
            if signalled:
                return int(signalled.group(1)), f"was killed by signal {signalled.group(2)}"
        return None

    def rank_log(self, rank: int) -> Optional[Path]:
        """The rank's stderr file: <logs>/1/rank.N/stderr from mpirun, <logs>/rank.N/stderr from horovodrun."""
        files = sorted(f for f in self.logs.glob("**/rank.*/stderr")  # horovodrun pads: rank.01 of 12
                       if f.parent.name.split(".", 1)[1].isdigit() and int(f.parent.name.split(".", 1)[1]) == rank)
        return files[-1] if files else None

    def rank_lines(self, rank: int, count: int = RANK_LOG_LINES) -> list[str]:
        """The last non-empty lines the rank wrote to stderr (its traceback's end), from its log file."""
        log = self.rank_log(rank)
        if log is None:
            return []
        lines = (_RANK_TAG.sub("", line, count=1) for line in log.read_text(errors="replace").splitlines())
        return [line for line in lines if line.strip()][-count:]

    def failure_message(self, code: int) -> str:
        """The MPIJob's Failed message: the rank that failed and its last lines, where mpirun named it."""
        found = self.failed_rank()
        if found is None:
            return f"the training exited with code {code}"
        rank, how = found
        lines = self.rank_lines(rank)
        error = next((line for line in reversed(lines) if not line.startswith(" ")), "")
        quoted = f": {error[:200]}" if error else ""
        log = self.rank_log(rank)
        where = f" (its log: {log})" if log else ""
        return f"rank {rank} {how}{quoted}{where}; the other ranks were stopped"


@dataclass
class StallWatch:
    """No heartbeat for the stall timeout while training runs: the run is stalled. Beats count from the first one
    of this attempt (a heartbeat.json older than the attempt is an earlier attempt's); before it, start-up is
    bounded by the ranks' own exits, not by this watch."""

    setting: int | str  # spec.training.stallTimeout
    started: float = field(default_factory=time.time)  # this attempt's start, on the writers' clock (this machine)

    def stalled(self, beat: Optional[Heartbeat], now: Optional[float] = None) -> Optional[str]:
        """The Stalled message, or None while the heartbeat is fresh (or none has come yet)."""
        if beat is None:
            return None
        if beat.time < self.started - 1:
            return None
        timeout = stall_timeout_seconds(self.setting, beat.longest_gap_seconds)
        age = (time.time() if now is None else now) - beat.time
        if timeout is None or age <= timeout:
            return None
        epoch = f"epoch {beat.epoch}, " if beat.epoch is not None else ""
        return (f"no heartbeat for {age:.0f} s (stallTimeout {timeout:.0f} s): the last was {epoch}step {beat.step} "
                f"({beat.phase}) from rank {beat.rank}")
