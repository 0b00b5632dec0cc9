"""The chart's NetworkPolicies (the run pods', and the operator's status port), as a real kube-apiserver takes them:
created with dry-run, stored as rendered (nothing dropped or rewritten by an older server).

Whether a cluster enforces it is its CNI's business: the node cluster of tests/e2e (bridge, host-local,
portmap, firewall plugins) enforces no NetworkPolicy, so no run there can show it at work (docs/security.md).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.support.chart import CHART, helm, render

pytestmark = pytest.mark.k8s


def test_the_api_server_takes_the_network_policies_as_rendered(helm, api_client, namespace):
    """The runs' policy (in each run namespace) and, with the status endpoint on (the default), the operator's
    (in the release's namespace: here the test's own, so that both can be created)."""
    objects = render(helm, CHART / "ci/networkpolicy-values.yaml", "--set", f"networkPolicy.namespaces={{{namespace}}}",
                     namespace=namespace)
    policies = {p["metadata"]["name"]: p for p in objects if p["kind"] == "NetworkPolicy"}
    assert sorted(policies) == ["t-scalingrun-operator", "t-scalingrun-runs"]
    for policy in policies.values():
        assert policy["metadata"]["namespace"] == namespace
        created = client.NetworkingV1Api(api_client).create_namespaced_network_policy(namespace, policy,
                                                                                      dry_run="All")
        assert api_client.sanitize_for_serialization(created.spec) == policy["spec"]
