"""The smallest valid ScalingRun, and one with some of its spec's sections filled: the unit tests' one starting point."""

from __future__ import annotations

import copy
from typing import Any

MINIMAL: dict[str, Any] = {
    "apiVersion": "scalingrun.dev/v1alpha1",
    "kind": "ScalingRun",
    "metadata": {"name": "demo"},
    "spec": {
        "storage": {"credentialsSecret": "s3-creds"},
        "dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/parquet"},
    },
}


def run_document(**sections: dict[str, Any]) -> dict[str, Any]:
    """A copy of MINIMAL with each named spec section created or updated with the given fields."""
    doc = copy.deepcopy(MINIMAL)
    for section, fields in sections.items():
        doc["spec"].setdefault(section, {}).update(fields)
    return doc
