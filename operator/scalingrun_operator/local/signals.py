"""SIGTERM, SIGINT and SIGHUP (the terminal closed) to a local run, sweep or quick start: raised as Stopped in the
main thread, so that every `finally` on the way out runs (the ranks, mpirun, the preprocessing shards and the
SeaweedFS it started are stopped), then the command exits 128 + the signal's number (143 for SIGTERM, 130 for
SIGINT, 129 for SIGHUP), as a shell reports a process a signal ended. A second signal during that clean-up is
ignored: the clean-up is bounded on its own."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(BaseException):
    """The run was told to stop by a signal (a BaseException, as KeyboardInterrupt: no `except Exception` keeps
    it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within: SIGTERM, SIGINT and SIGHUP raise Stopped once; the handlers before are restored after."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}

    def raise_stopped(signum, frame) -> None:
        for each in SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise Stopped(signum)

    for signum in SIGNALS:
        signal.signal(signum, raise_stopped)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
