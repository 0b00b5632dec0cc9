"""Where a HorovodRunner(np > 0) run's function lives: `<runLocation>/function/<sha256>/` in the run's own store
(s3://, or file:// and /path for a local run), written by the client with this environment's keys, read by every
rank with the run's, rank 0's value read back from the same folder (scalingrun_api.shipped names the files). `endpoint`: where this
machine reaches the store when that is not where the pods do (a port-forward to an in-cluster store)."""

from __future__ import annotations

from typing import Optional

from scalingrun_api.models import ScalingRun
from scalingrun_api.shipped import DIGEST_FILE, MAX_PAYLOAD_BYTES, PAYLOAD_FILE
from scalingrun_operator.builders.locations import join, run_location
from scalingrun_operator.object_store import Store, read_bytes, write_bytes


def function_folder(run: ScalingRun, digest: str) -> str:
    return join(run_location(run), "function", digest.split(":", 1)[1])


def _store(run: ScalingRun, endpoint: Optional[str]) -> Store:
    storage = run.spec.storage
    return Store(endpoint or storage.endpoint, storage.region, max_bytes=MAX_PAYLOAD_BYTES)


def put(run: ScalingRun, uri: str, data: bytes, endpoint: Optional[str] = None) -> None:
    write_bytes(uri, _store(run, endpoint), data)


def store(run: ScalingRun, payload: bytes, digest: str, endpoint: Optional[str] = None) -> str:
    """The payload and its digest in the run's store; the folder's URI."""
    folder = function_folder(run, digest)
    put(run, join(folder, PAYLOAD_FILE), payload, endpoint)
    put(run, join(folder, DIGEST_FILE), (digest + "\n").encode(), endpoint)
    return folder


def get(run: ScalingRun, uri: str, endpoint: Optional[str] = None) -> Optional[bytes]:
    return read_bytes(uri, _store(run, endpoint))
