"""An elastic run's time at each size, pure: the one account of it (status.training.elastic: sizes, counting,
startedAt), kept by decide/elastic.py and read by `scalingrun get -o wide` and `scalingrun report`.

The run's training time is split by the size it trained at, a size's time running from when the run trained at it
(its first MPIJob made, or a resize's trainingAt) to the next resize's trainingAt or the end; a suspended or queued
MPIJob's time counts for no size. `counting` is the size whose time runs now and since when; its time is added to
`sizes` when the size changes, the MPIJob is paused, or it ends. Everything is read from status, so a look after a
restart adds nothing twice; while no resize has left the last 20 and the MPIJob was never paused, `sizes` agrees
with the step plot of the resizes (`worker_steps`). Times are whole seconds, as status writes them, so the sums stay
exact.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from scalingrun_api.models.status import MAX_RESIZES, ElasticStatus, SizeCounting, SizeTime
from .status import parse_time, rfc3339


def read(training_status: Optional[dict[str, Any]]) -> ElasticStatus:
    """status.training.elastic, typed (its CRD schema is this model's); empty for a run without one."""
    return ElasticStatus.model_validate((training_status or {}).get("elastic") or {})


def written(elastic: ElasticStatus) -> dict[str, Any]:
    """status.training.elastic as status holds it: what is unset (or an empty list) is left out."""
    return elastic.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


def size_time(workers: int, seconds: int, gpus_per_worker: int) -> SizeTime:
    """One size's time: seconds, worker-hours (workers x time) and, for workers that ask for GPUs, GPU-hours."""
    return SizeTime(workers=workers, seconds=seconds, worker_hours=round(workers * seconds / 3600, 4),
                    gpu_hours=round(workers * gpus_per_worker * seconds / 3600, 4) if gpus_per_worker else None)


def _added(sizes: list[SizeTime], workers: int, seconds: float, gpus_per_worker: int) -> list[SizeTime]:
    """`sizes` (one entry per size, the largest first) with `seconds` more at `workers`."""
    by_size = {entry.workers: entry.seconds for entry in sizes}
    by_size[workers] = by_size.get(workers, 0) + max(0, int(seconds))
    return [size_time(w, s, gpus_per_worker) for w, s in sorted(by_size.items(), reverse=True)]


def folded(elastic: ElasticStatus, at: dt.datetime, gpus_per_worker: int) -> ElasticStatus:
    """The counting size's time up to `at` added to `sizes`; the count goes on from `at` (never from before its
    own start: a clock behind the count adds nothing)."""
    since = parse_time(elastic.counting.since) if elastic.counting else None
    if since is None:
        return elastic
    at = max(at.replace(microsecond=0), since)
    workers = elastic.counting.workers
    return elastic.model_copy(update={
        "sizes": _added(elastic.sizes, workers, (at - since).total_seconds(), gpus_per_worker),
        "counting": SizeCounting(workers=workers, since=rfc3339(at))})


def switched(elastic: ElasticStatus, workers: Optional[int], at: dt.datetime, gpus_per_worker: int) -> ElasticStatus:
    """The time so far added to its size; from `at` the time runs at `workers` (None: at no size)."""
    elastic = folded(elastic, at, gpus_per_worker)
    if workers is None:
        return elastic.model_copy(update={"counting": None})
    return elastic.model_copy(update={"counting": SizeCounting(workers=workers, since=rfc3339(at)),
                                      "started_at": elastic.started_at or rfc3339(at)})


def clocked(elastic: ElasticStatus, workers: Optional[int], at: dt.datetime, gpus_per_worker: int) -> ElasticStatus:
    """The clock running at `workers` (None: stopped: the MPIJob paused or ended) from `at` if it was not; a clock
    already in that state is left as it is, so a look that changes neither writes nothing."""
    if (elastic.counting is None) == (workers is None):
        return elastic
    return switched(elastic, workers, at, gpus_per_worker)


def time_at_sizes(elastic: ElasticStatus, gpus_per_worker: int, until: Optional[dt.datetime]) -> list[SizeTime]:
    """status.training.elastic.sizes with the counting size's time up to `until` (the reader's now, or the run's
    completionTime) added: what `scalingrun get` and the report show."""
    return list((folded(elastic, until, gpus_per_worker) if until is not None else elastic).sizes)


def worker_steps(elastic: ElasticStatus, until: dt.datetime) -> list[tuple[dt.datetime, int]]:
    """The worker count over time from the resizes: (moment, workers from then on), the first at startedAt, one at
    each resize's trainingAt, the last at `until` (repeating the last count, to end a step plot). With all 20
    resizes kept, earlier ones may have been dropped: the steps then start at the oldest kept resize's loss."""
    resizes = [(r, parse_time(r.training_at)) for r in elastic.resizes if parse_time(r.training_at)]
    first = resizes[0][0].from_ if resizes else (elastic.counting.workers if elastic.counting else None) \
        or elastic.workers
    start = parse_time(elastic.started_at)
    if resizes and (start is None or len(elastic.resizes) >= MAX_RESIZES):
        start = parse_time(resizes[0][0].lost_at) or resizes[0][1]
    if start is None or first is None:
        return []
    steps = [(start, first)] + [(trained, r.to) for r, trained in resizes]
    return steps + [(max(until, steps[-1][0]), steps[-1][1])]
