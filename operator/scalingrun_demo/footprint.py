"""What the quick start puts in a cluster, by name, and its record of it: the demo namespace carries a label that says
the quick start made it (OWNED) and an annotation that lists what else it installed (ADDED), which `--down`
(teardown.py) reads."""

from __future__ import annotations

from typing import Any, Optional

from . import seaweedfs
from .delivery import Kube, QuickstartError

NAMESPACE = "scalingrun-quickstart"
RELEASE, SYSTEM_NAMESPACE = "scalingrun", "scalingrun-system"
RUN_NAME = "quickstart"
SECRET = "quickstart-s3"
OWNED = "scalingrun.dev/quickstart"  # label of the demo namespace: made by the quick start
ADDED = "scalingrun.dev/quickstart-added"  # its annotation: what else the quick start installed (JSON)
LABELS = {"app.kubernetes.io/name": seaweedfs.SERVICE, "app.kubernetes.io/part-of": "scalingrun-quickstart"}
OPERATOR_CRDS = ("scalingruns.scalingrun.dev", "scalingsweeps.scalingrun.dev")


def demo_namespace(kube: Kube, namespace: str) -> Optional[dict[str, Any]]:
    """The demo namespace when the quick start made it, None when there is none; an error when it is someone else's."""
    found = kube.get("namespace", namespace)
    if found is not None and (found["metadata"].get("labels") or {}).get(OWNED) != "true":
        raise QuickstartError(f"namespace {namespace} exists and the quick start did not make it: give another "
                              "with --namespace")
    return found
