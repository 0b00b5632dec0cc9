"""Decoding a shard's files in worker processes (spawned), each fetching a batch of objects at once and decoding them
in order as they arrive, so that a GET's wait overlaps decoding."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional

from ..storage import Location, open_location
from .images import BadImage, scale_image
from .plan import PlannedFile
from .source import Params

# Objects a decoding process fetches at once: it decodes one while the others download, so a GET's wait
# (milliseconds against S3, more than the decode) overlaps the decoding instead of adding to it.
FETCH_AHEAD = 8

_worker_source: Optional[Location] = None
_worker_fetcher: Optional[ThreadPoolExecutor] = None


def _init_worker(source_uri: str, endpoint: Optional[str], region: Optional[str], fetch_ahead: int) -> None:
    global _worker_source, _worker_fetcher
    _worker_source = open_location(source_uri, endpoint, region)
    _worker_fetcher = ThreadPoolExecutor(fetch_ahead, thread_name_prefix="fetch") if fetch_ahead > 1 else None


def _fetch(planned: PlannedFile) -> bytes:
    return _worker_source.join(planned.path).read_bytes()


def _decode(planned: PlannedFile, data: Callable[[], bytes],
            side: int) -> tuple[PlannedFile, Optional[bytes], Optional[str]]:
    try:
        return planned, scale_image(data(), side), None
    except BadImage as exc:
        return planned, None, str(exc)
    except OSError as exc:  # unreadable object: count it as bad, like an undecodable one
        return planned, None, f"read failed: {exc}"


def _decode_batch(task: tuple[list, int]) -> list:
    """A batch of files, decoded in order, their objects fetched together (all GETs in flight at the start)."""
    batch, side = task
    if _worker_fetcher is None:
        return [_decode(f, lambda f=f: _fetch(f), side) for f in batch]
    fetches = [_worker_fetcher.submit(_fetch, f) for f in batch]
    return [_decode(f, fetch.result, side) for f, fetch in zip(batch, fetches)]


def _batches(files: Iterator[PlannedFile], size: int) -> Iterator[list]:
    batch = []
    for f in files:
        batch.append(f)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def decode_files(files: Iterator[PlannedFile], params: Params, workers: int,
                 fetch_ahead: int = FETCH_AHEAD) -> Iterator[tuple[PlannedFile, Optional[bytes], Optional[str]]]:
    """The files decoded, in their order; `files` is consumed as the work goes (never held whole)."""
    tasks = ((batch, params.image_size) for batch in _batches(files, max(fetch_ahead, 1)))
    init = (params.source, params.endpoint, params.region, fetch_ahead)
    if workers <= 1:
        _init_worker(*init)
        try:
            for decoded in map(_decode_batch, tasks):
                yield from decoded
        finally:
            if _worker_fetcher is not None:  # this process's own: the next shard (--all-shards) makes another
                _worker_fetcher.shutdown(wait=False)
        return
    # spawn, not fork: the parent's S3 client threads must not be forked.
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, init) as pool:
        for decoded in pool.imap(_decode_batch, tasks):
            yield from decoded
