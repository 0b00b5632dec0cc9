"""The wall clock, read by whoever looks at a run (the operator's reconcile, the local runner), never by decide:
the time of a look is an input to it."""

from __future__ import annotations

import datetime as dt


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
