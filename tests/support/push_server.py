"""The operator's status endpoint (StatusServer) on this machine for a test: it serves a test certificate, keeps the
pushes in its own PushedDocuments and counts them in its own Metrics, as the operator's runtime wires it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from scalingrun_operator.cluster.metrics import Metrics
from scalingrun_operator.pushed import PushedDocuments
from scalingrun_operator.status_server import Authenticator, StatusServer


@contextlib.contextmanager
def push_server(authenticator: Authenticator, tls: Path, port: int = 0) -> Iterator[StatusServer]:
    """A StatusServer on 127.0.0.1:`port` (0: a free port) serving the certificate written under `tls`
    (tests.support.tls.write_serving_certificate), until the block ends. Beside its own `pushed` and `port`, the server
    carries `metrics` (its refusals and acceptances counted), `pushes` ((namespace, run, kind) of each push taken)
    and `ca` (the CA's file, for the client)."""
    metrics, pushes = Metrics(), []
    server = StatusServer(authenticator, PushedDocuments(), str(tls / "tls.crt"), str(tls / "tls.key"), port=port,
                          host="127.0.0.1", on_push=lambda namespace, name, what: pushes.append((namespace, name, what)),
                          count_refused=lambda reason: metrics.push_refusals.labels(reason=reason).inc(),
                          count_accepted=lambda what: metrics.pushes.labels(document=what).inc())
    server.metrics, server.pushes, server.ca = metrics, pushes, tls / "ca.crt"
    server.start()
    try:
        yield server
    finally:
        server.stop()
