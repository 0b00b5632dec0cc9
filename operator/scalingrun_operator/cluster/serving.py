"""Which replica the status Service sends pushes to: the one that serves the status endpoint.

Only the leader (or the one operator of a standalone install) runs the endpoint; a standby has no listener on the
port. A Service over every replica would send about half the pushes to a closed port, and each refused push backs
its pod's pusher off for longer. So the pod that serves labels itself SERVING_LABEL, which the chart's status Service
selects, and a starting process removes the label from its pod first: a restarted container is a standby until it
leads. A leader that loses its Lease exits (leader.py), so its pod is relabelled as it starts again.
"""

from __future__ import annotations

import logging

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

SERVING_LABEL = "scalingrun.dev/status-endpoint"
SERVING = "serving"


def mark_serving(api_client: client.ApiClient, namespace: str, pod: str, serving: bool) -> None:
    """Sets (or removes) SERVING_LABEL on the operator's own pod. No such pod (an operator run outside the pod it
    names, as the tests run it) is said and passed over; any other refusal (RBAC) raises."""
    try:
        client.CoreV1Api(api_client).patch_namespaced_pod(
            pod, namespace, {"metadata": {"labels": {SERVING_LABEL: SERVING if serving else None}}})
    except ApiException as exc:
        if exc.status != 404:
            raise
        log.warning("no pod %s/%s to label: the status Service sends this operator no push", namespace, pod)
        return
    log.info("pod %s/%s %s the status endpoint's traffic", namespace, pod, "takes" if serving else "does not take")
