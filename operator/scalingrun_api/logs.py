"""Where a run's logs are archived: `<runLocation>/logs/` (status.logs), written by the trainer image's launcher at
the end of every attempt (and every minute on the way), read by `scalingrun logs` once the pods are gone.

    logs/attempt-<n>/attempt.json   which pod, when, how it ended (AttemptRecord)
    logs/attempt-<n>/launcher.log   the launcher's log (mpirun's output: every rank's lines, tagged [1,<rank>]),
                                    its last LAUNCHER_LOG_BYTES
    logs/attempt-<n>/rank-<r>.log   rank r's last RANK_TAIL_LINES lines (at most RANK_TAIL_BYTES), tags removed
    logs/preprocess/<pod>.log       a preprocessing pod's log (a pod per try), its last LAUNCHER_LOG_BYTES

Attempts count from 1 in the order the launchers started: a launcher claims the next free number when it starts.
Standard library and pydantic only: both images read these names.
"""

from __future__ import annotations

import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

LOGS_FOLDER = "logs"
PREPROCESS_FOLDER = "preprocess"
ATTEMPT_RECORD = "attempt.json"
LAUNCHER_LOG = "launcher.log"
LAUNCHER_LOG_BYTES = 1024 * 1024  # the launcher log's end kept: a few thousand epochs' lines of every rank
RANK_TAIL_LINES = 200
RANK_TAIL_BYTES = 64 * 1024
LINE_BYTES = 16 * 1024  # a longer line is cut (a progress bar redrawn without newlines, a dumped array)
_ATTEMPT = re.compile(r"attempt-([1-9][0-9]{0,8})")
_RANK = re.compile(r"rank-(0|[1-9][0-9]{0,6})\.log")
# Open MPI's --tag-output: "[<job>,<rank>]<stdout>:" before every piece of output a rank writes.
RANK_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")


def attempt_folder(number: int) -> str:
    return f"attempt-{number}"


def attempt_number(folder: str) -> Optional[int]:
    """The number of an `attempt-<n>` folder name (a trailing slash allowed); None for any other name."""
    match = _ATTEMPT.fullmatch(folder.rstrip("/"))
    return int(match.group(1)) if match else None


def rank_log(rank: int) -> str:
    return f"rank-{rank}.log"


def rank_of(name: str) -> Optional[int]:
    match = _RANK.fullmatch(name)
    return int(match.group(1)) if match else None


class AttemptRecord(BaseModel):
    """attempt.json: written when the launcher starts (state running), rewritten when it ends."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    attempt: int = Field(..., description="1 for the first launcher, 2 for the next, ...")
    pod: str = Field("", description="The launcher pod (its hostname).")
    started: str = Field("", description="When the launcher started (RFC 3339).")
    ended: Optional[str] = Field(None, description="When it ended; none while it runs (or when it was killed).")
    state: str = Field("running", description="running, succeeded, failed or stopped (a signal: the pod deleted).")
    exit_code: Optional[int] = Field(None, description="The command's exit code (128 + N for signal N).")
    signal: Optional[str] = Field(None, description="The signal that stopped the launcher (SIGTERM: pod deleted).")
    log_bytes: int = Field(0, description="Bytes of log the attempt wrote in all.")
    kept_bytes: int = Field(0, description="Of those, how many launcher.log keeps (its end).")
    ranks: list[int] = Field(default_factory=list, description="Ranks with a rank-<r>.log.")


class RankLines:
    """Each rank's whole lines in mpirun --tag-output's output. Open MPI 4 tags pieces, not lines: one rank's line
    may come as `[1,0]<stdout>:text[1,0]<stdout>:` and a newline, or be cut by another rank's piece and end in a
    later line of mpirun's. Pieces are joined per rank and stream until their newline (a line over `line_bytes`
    is given as it is). Text before a line's first tag (mpirun's own, the launcher's) belongs to no rank."""

    def __init__(self, line_bytes: int = LINE_BYTES):
        self.line_bytes = line_bytes
        self._pending: dict[tuple[int, bytes], bytes] = {}

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (rank, line) pairs `data` (a line of mpirun's output) completes, in order."""
        done: list[tuple[int, bytes]] = []
        tags = list(RANK_TAG.finditer(data))
        for index, tag in enumerate(tags):
            end = tags[index + 1].start() if index + 1 < len(tags) else len(data)
            rank, key = int(tag.group(2)), (int(tag.group(2)), tag.group(3))
            *whole, rest = (self._pending.pop(key, b"") + data[tag.end():end]).split(b"\n")
            done += [(rank, line + b"\n") for line in whole]
            if len(rest) > self.line_bytes:
                done.append((rank, rest + b"\n"))
            elif rest:
                self._pending[key] = rest
        return done
