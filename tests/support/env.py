"""What the tests may reach: the repository, CI or not, the cluster named for them; `require` skips a test whose
real part is missing, except in CI, where that is a failure. Imported first by tests/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def in_ci(value: "str | None") -> bool:
    """Any truthy CI (true, 1, yes, a CI system's own word): only unset, empty, 0, false, no or off is not CI.
    scripts/e2e.sh reads CI the same way."""
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


IN_CI = in_ci(os.environ.get("CI"))

# Tests reach only a cluster named for them: their own API server, or SCALINGRUN_TEST_KUBECONFIG (an explicit
# opt-in, like envtest's USE_EXISTING_CLUSTER). An ambient KUBECONFIG, ~/.kube/config or in-cluster account
# is never used: KUBECONFIG points at a file that does not exist, so kubectl, helm and the Python client
# find no cluster unless a test hands one over. Set before anything imports kubernetes (it reads KUBECONFIG
# once, at import).
TEST_KUBECONFIG_VARIABLE = "SCALINGRUN_TEST_KUBECONFIG"
NAMED_KUBECONFIG = os.environ.get(TEST_KUBECONFIG_VARIABLE) or None
NO_CLUSTER = "/nonexistent/scalingrun-tests-name-their-cluster/kubeconfig"
os.environ["KUBECONFIG"] = NO_CLUSTER
for _variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_variable, None)


def require(condition: bool, reason: str) -> None:
    """Skip when a real part is missing, except in CI, where that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason}; CI={os.environ.get('CI')} requires it", pytrace=False)
    pytest.skip(reason)
