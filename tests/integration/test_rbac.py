"""The operator's RBAC as the chart renders it is what the operator calls: nothing missing, nothing extra.

The operator runs as the chart's Deployment runs it (its args and environment, rendered), against a real
kube-apiserver that authorizes with RBAC, with a token of the chart's ServiceAccount and nothing but the
chart's (Cluster)Roles and bindings applied. A recording proxy sits between the two and notes every
request as the API server's authorizer sees it: verb, API group, resource, subresource. The test drives
one lifecycle that reaches every call the operator makes: a run adopts an orphaned ConfigMap and Job,
preprocesses, trains (MPIJob, progress, status, Events, suspend and resume), fails with its launcher's
log read, a sweep creates its points, and the leader renews its Lease. Then:
- a request refused (403) is a grant missing;
- a granted (verb, group, resource) that no request used is a grant too many.
Both install modes: cluster-wide (a ClusterRole) and namespaced (watch.namespaces, a Role in each), each as the
chart's defaults make it: the status endpoint on, the run's pods reporting and no role naming Secrets but the
operator's own certificate's (by name, in its namespace; made in one test, replaced in the other); and the
cluster-wide one in pull mode (statusServer.enabled=false, the opt-out), where the operator reads the run's store
with its Secret.

It needs an API server of its own: a cluster-wide operator would act on every other test's runs.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.support.chart import helm, render  # noqa: F401 (helm is a fixture)

from tests.support.recording_proxy import Request
from tests.support.operator import Cluster, new_run, progress, wait_for
from tests.support.rbac import (  # noqa: F401 (fixtures)
    BUCKET, _suffix, admin, bound_rules, bucket, certificate_secret, create_namespace, grants, lifecycle,
    operator_as_the_chart_runs_it, rbac_kubeconfig,
)

pytestmark = pytest.mark.k8s


# --- fixtures -------------------------------------------------------------------------------------


# --- the chart's objects, applied -----------------------------------------------------------------


# --- the lifecycle ---------------------------------------------------------------------------------


def check_least_privilege(requests: list[Request], rules: list[dict],
                          used_elsewhere: frozenset[tuple[str, str, str]] = frozenset()) -> None:
    """`used_elsewhere`: grants this lifecycle cannot reach, which another test here uses (each must be granted)."""
    resource_requests = [r for r in requests if r.is_resource]
    refused = sorted({(r.grant, r.namespace) for r in resource_requests if r.status == 403})
    assert not refused, f"refused (a grant missing): {refused}"
    used = {r.grant for r in resource_requests if r.status != 403}
    granted = grants(rules)
    print("\nrequests by (verb, group, resource):")
    for grant, count in sorted(Counter(r.grant for r in resource_requests).items()):
        print(f"  {count:5d}  {grant}{'' if grant in granted else '  (no grant)'}")
    assert used <= granted, f"allowed without a grant of the chart: {sorted(used - granted)}"
    unused = granted - used - ADMISSION_ONLY - used_elsewhere
    assert not unused, f"granted and never used: {sorted(unused)}"
    assert used_elsewhere <= granted - used, f"used after all, or not granted: {sorted(used_elsewhere)}"
    assert ADMISSION_ONLY <= granted, f"blockOwnerDeletion needs: {sorted(ADMISSION_ONLY - granted)}"


# Never requested: the admission plugin OwnerReferencesPermissionEnforcement (on in OpenShift, off on the test's
# API server) checks them when a child names its owner with blockOwnerDeletion: true (kopf.adopt sets it).
ADMISSION_ONLY = {("update", "scalingrun.dev", "scalingruns/finalizers"),
                  ("update", "scalingrun.dev", "scalingsweeps/finalizers")}


# --- tests ----------------------------------------------------------------------------------------

# The lifecycle resizes an elastic run, which probes for capacity: the grant that takes (pods create) is on.
PROBES = ("--set", "elastic.capacityProbes=true")


def rules_of_the_operator(objects: list[dict]) -> list[dict]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return bound_rules(objects, deployment["spec"]["template"]["spec"]["serviceAccountName"],
                       deployment["metadata"]["namespace"])


def test_in_pull_mode_the_cluster_wide_install_grants_what_the_operator_calls(helm, admin, bucket, s3_server,
                                                                              tmp_path):
    home = f"cw-system-{_suffix()}"
    objects = render(helm, None, "--set", "crds.enabled=false", "--set", "statusServer.enabled=false", *PROBES,
                     release="rbac-cw", namespace=home)
    assert ("get", "", "secrets") in grants(rules_of_the_operator(objects))
    create_namespace(admin, home)
    with operator_as_the_chart_runs_it(admin, objects, tmp_path) as (operator, proxy):
        lifecycle(create_namespace(admin, f"cw-team-{_suffix()}", s3_server), bucket, s3_server, operator)
    check_least_privilege(proxy.requests, rules_of_the_operator(objects))


def only_its_certificate(requests: list[Request], home: str, secret: str) -> list[Request]:
    """The requests for Secrets that are not for the operator's own certificate, in its own namespace."""
    return [r for r in requests if r.is_resource and r.resource == "secrets"
            and not (r.namespace == home and r.name in (secret, "") and (r.name or r.verb == "create"))]


def test_the_default_cluster_wide_install_reads_no_secret_but_its_certificates(
        helm, admin, bucket, s3_server, tmp_path):
    """The default install (the status endpoint on): the same lifecycle, the run's pods reporting with the
    certificate the operator keeps. The only Secret it reaches is that one, by name in its own namespace (a read of
    any other would be refused: 403), here replacing the one an earlier chart made (get, update); every grant is
    used, TokenReviews too, and the Secret's create in the namespaced test."""
    home = f"cwp-system-{_suffix()}"
    objects = render(helm, None, "--set", "crds.enabled=false", *PROBES, release="rbac-cwp", namespace=home)
    secret = certificate_secret(next(o for o in objects if o["kind"] == "Deployment"))
    assert [(o["kind"], rule.get("resourceNames")) for o in objects if o["kind"] in ("ClusterRole", "Role")
            for rule in o.get("rules") or [] if {"secrets", "*"} & set(rule.get("resources", []))] == [
        ("Role", None), ("Role", [secret])]  # create (no name can limit it); get, update
    create_namespace(admin, home)
    with operator_as_the_chart_runs_it(admin, objects, tmp_path, earlier_certificate=True) as (operator, proxy):
        lifecycle(create_namespace(admin, f"cwp-team-{_suffix()}", s3_server), bucket, s3_server, operator, push=True)
    assert only_its_certificate(proxy.requests, home, secret) == []
    check_least_privilege(proxy.requests, rules_of_the_operator(objects),
                          used_elsewhere=frozenset({("create", "", "secrets")}))


def test_namespaced_install_grants_what_the_operator_calls(helm, admin, bucket, s3_server, tmp_path):
    """The namespaced profile with the chart's defaults: the push path, so no Role names Secrets but the operator's
    certificate's in its own namespace."""
    home, suffix = f"ns-system-{_suffix()}", _suffix()
    team, other, unwatched = (f"ns-team-{n}-{suffix}" for n in ("a", "b", "c"))
    objects = render(helm, None, "--set", "crds.enabled=false", "--set", f"watch.namespaces={{{team},{other}}}",
                     *PROBES, release="rbac-ns", namespace=home)
    clusters = [create_namespace(admin, name, s3_server) for name in (home, team, other, unwatched)][1:]
    with operator_as_the_chart_runs_it(admin, objects, tmp_path) as (operator, proxy):
        lifecycle(clusters[0], bucket, s3_server, operator, push=True)
        # The second namespace is served too; the third, not watched, is not even seen.
        for cluster in clusters[1:]:
            prefix = f"s3://{BUCKET}/{cluster.ns}"
            cluster.create_run(new_run(cluster.ns, "other", s3_server, dataset={
                "source": f"{prefix}/raw", "output": f"{prefix}/data"}))
        wait_for(clusters[1].phase_is("other", "Preprocessing"), what="the second namespace served", operator=operator)
        time.sleep(2)
        assert not clusters[2].status("other"), "a run in a namespace the operator does not watch"
    assert not {r.namespace for r in proxy.requests if r.namespace} - {home, team, other}
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert only_its_certificate(proxy.requests, home, certificate_secret(deployment)) == []
    # Its certificate made here (get, create); replaced (update) in the cluster-wide test.
    check_least_privilege(proxy.requests, rules_of_the_operator(objects),
                          used_elsewhere=frozenset({("update", "", "secrets")}))
