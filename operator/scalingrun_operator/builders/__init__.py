"""Pure, I/O-free builders of the objects a ScalingRun owns. The operator and `scalingrun render` share them."""

from __future__ import annotations

from typing import Any, Sequence

from scalingrun_api.models import ScalingRun, Toleration
from .config import build_config_map
from .mpijob import DEFAULT_GPU_TOLERATIONS, build_mpijob
from .preprocess import build_preprocess_job


def build_children(run: ScalingRun, namespace: str,
                   gpu_tolerations: Sequence[Toleration] = DEFAULT_GPU_TOLERATIONS) -> list[dict[str, Any]]:
    """Every object the operator creates for `run`, in creation order (without owner references); `scalingrun
    render` shows the GPU tolerations of the operator's default setting."""
    return [
        build_config_map(run, namespace),
        build_preprocess_job(run, namespace),
        build_mpijob(run, namespace, gpu_tolerations),
    ]


__all__ = ["build_children", "build_config_map", "build_mpijob", "build_preprocess_job"]
