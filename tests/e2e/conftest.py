"""The cluster the e2e runs in, as scripts/e2e.sh leaves it: its export lines name the kubeconfig, the
namespace for ScalingRuns, the S3 endpoint and Secret, and the trainer image. Without them the in-cluster
tests are skipped (a failure with any truthy CI); scripts/e2e.sh sets them."""

from __future__ import annotations

import os

import pytest

from tests.support.env import require
from tests.support.e2e_cluster import InCluster, connect, missing_variables
from tests.support.store_connections import StoreConnectionSampler
from tests.e2e.environment import S3_PORT


@pytest.fixture(scope="session")
def cluster() -> InCluster:
    missing = missing_variables()
    require(not missing, f"the in-cluster e2e needs {', '.join(missing)}: run it with scripts/e2e.sh")
    return connect()


@pytest.fixture(scope="session", autouse=True)
def operator_store_connections(request):
    """With the status endpoint on (SCALINGRUN_E2E_STATUS_PUSH=1), the operator connects to no run's store: its
    pods' sockets are sampled from this host the whole session (tests/support/store_connections.py), where the node
    cluster's pods run (SCALINGRUN_E2E_NODE_DIR); a cluster elsewhere cannot be looked into this way."""
    if not os.environ.get("SCALINGRUN_E2E_NODE_DIR"):
        yield None
        return
    sampler = StoreConnectionSampler(S3_PORT).start()
    yield sampler
    sampler.stop()
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\ne2e: {sampler.summary()}", flush=True)  # the measurement, in the e2e's log
    if os.environ.get("SCALINGRUN_E2E_STATUS_PUSH", "1") == "1" and request.session.testscollected:
        assert sampler.samples and any(sampler.operators.values()), \
            f"no operator with the status endpoint on was seen on this host: {sampler.summary()}"
        assert not sampler.push_mode_connections(), (
            f"an operator with the status endpoint on connected to the store: {sampler.push_mode_connections()}; "
            f"{sampler.summary()}")
