"""The chart's NetworkPolicy for run pods, as a real kube-apiserver takes it: created with dry-run, stored as
rendered (nothing dropped or rewritten by an older server).

Whether a cluster enforces it is its CNI's business: the node cluster of tests/e2e (bridge, host-local,
portmap, firewall plugins) enforces no NetworkPolicy, so no run there can show it at work (docs/security.md).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.support.chart import CHART, helm, render

pytestmark = pytest.mark.k8s


def test_the_api_server_takes_the_network_policy_as_rendered(helm, api_client, namespace):
    objects = render(helm, CHART / "ci/networkpolicy-values.yaml", "--set", f"networkPolicy.namespaces={{{namespace}}}")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert [p["metadata"]["namespace"] for p in policies] == [namespace]
    created = client.NetworkingV1Api(api_client).create_namespaced_network_policy(namespace, policies[0],
                                                                                  dry_run="All")
    assert api_client.sanitize_for_serialization(created.spec) == policies[0]["spec"]
