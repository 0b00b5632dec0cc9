"""Pure, I/O-free builders of the objects a ScalingRun owns. The operator and `scalingrun render` share them."""

from __future__ import annotations

from typing import Any

from scalingrun_api.models import ScalingRun
from .config import build_config_map
from .mpijob import build_mpijob
from .preprocess import build_preprocess_job


def build_children(run: ScalingRun, namespace: str) -> list[dict[str, Any]]:
    """Every object the operator creates for `run`, in creation order (without owner references)."""
    return [
        build_config_map(run, namespace),
        build_preprocess_job(run, namespace),
        build_mpijob(run, namespace),
    ]


__all__ = ["build_children", "build_config_map", "build_mpijob", "build_preprocess_job"]
