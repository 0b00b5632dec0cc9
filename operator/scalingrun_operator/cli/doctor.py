"""`scalingrun doctor`: what the cluster of the kube context has and lacks for ScalingRuns to train, one line per
check, with the user's credentials: the MPIJob API and its controller (and the Training Operator v1 beside it), Kueue,
the CRDs' version against this scalingrun's, the operator and its /healthz (cluster/preflight.py); for the runs of
the namespace, the GPU resource they ask for on the nodes, the NVIDIA driver, Kueue's MPIJob integration and their
LocalQueues (cluster/preflight_fit.py)."""

from __future__ import annotations

import argparse
import sys

from .cluster import Cluster
from .loading import OK, UserError

FAILED = 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    from ..cluster.preflight import ERROR, KUEUE_GROUP, gather, judge
    from ..cluster.preflight_fit import gather_fit, judge_fit

    cluster = Cluster(args)
    api_client = cluster.api_client
    try:
        facts = gather(api_client)
        checks = judge(facts) + judge_fit(gather_fit(api_client, cluster.namespace, facts.groups.get(KUEUE_GROUP, {})))
    except ApiException as exc:
        raise UserError(f"scalingrun doctor: the API server answered {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise UserError(f"scalingrun doctor: cannot reach the API server: {exc}") from None
    width = max(len(check.name) for check in checks)
    for check in checks:
        print(f"{check.level:<8} {check.name:<{width}}  {check.message}")
    errors = [check.name for check in checks if check.level == ERROR]
    if errors:
        print(f"scalingrun doctor: {len(errors)} problem{'s' if len(errors) > 1 else ''} to fix first: "
              f"{', '.join(errors)}", file=sys.stderr)
        return FAILED
    return OK
