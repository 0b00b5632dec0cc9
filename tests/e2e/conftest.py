"""The cluster the e2e runs in, as scripts/e2e.sh leaves it: its export lines name the kubeconfig, the
namespace for ScalingRuns, the S3 endpoint and Secret, and the trainer image. Without them the in-cluster
tests are skipped (a failure with any truthy CI); scripts/e2e.sh sets them."""

from __future__ import annotations


import pytest

from tests.support.env import require
from tests.support.e2e_cluster import InCluster, connect, missing_variables


@pytest.fixture(scope="session")
def cluster() -> InCluster:
    missing = missing_variables()
    require(not missing, f"the in-cluster e2e needs {', '.join(missing)}: run it with scripts/e2e.sh")
    return connect()
