"""What a run is held to once it has started: the spec it started with, except runPolicy.suspend.

Children are built from the spec at the moment they are created, and the preprocessing parameters
fix the dataset the trainer reads, so a change of dataset, model, workers (or anything else but
suspend) mid-run would make the parts disagree. The spec seen at the first reconcile is pinned in an
annotation; later changes are not applied and are reported in a SpecChangeIgnored condition.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

PINNED_ANNOTATION = "scalingrun.dev/pinned-spec"
LIVE_FIELDS = (("runPolicy", "suspend"),)


def _without_live(spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for section, key in LIVE_FIELDS:
        if isinstance(out.get(section), dict):
            out[section].pop(key, None)
            if not out[section]:
                del out[section]
    return out


def pin(spec: dict[str, Any]) -> str:
    """The annotation value recording the spec a run started with."""
    return json.dumps(_without_live(spec), sort_keys=True, separators=(",", ":"))


def _load(pinned: Optional[str]) -> Optional[dict[str, Any]]:
    if not pinned:
        return None
    try:
        value = json.loads(pinned)
    except ValueError:
        return None  # a hand-edited annotation: treat as not pinned (re-pinned by the caller)
    return value if isinstance(value, dict) else None


def effective_spec(spec: dict[str, Any], pinned: Optional[str]) -> dict[str, Any]:
    """The pinned spec with the live fields taken from the current spec."""
    base = _load(pinned)
    if base is None:
        return copy.deepcopy(spec)
    out = copy.deepcopy(base)
    for section, key in LIVE_FIELDS:
        if key in (spec.get(section) or {}):
            out.setdefault(section, {})[key] = spec[section][key]
    return out


def _diff(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{path}.{key}")
        return out
    return [] if old == new else [path]


def ignored_changes(spec: dict[str, Any], pinned: Optional[str]) -> list[str]:
    """Paths (spec.workers.replicas, ...) whose current value differs from the pinned one."""
    base = _load(pinned)
    if base is None:
        return []
    return _diff(base, _without_live(spec), "spec")


def ignored_message(paths: list[str]) -> str:
    shown = ", ".join(paths[:8]) + (f" and {len(paths) - 8} more" if len(paths) > 8 else "")
    return (f"{shown} changed after the run started and will not be applied: the run keeps the values it "
            "started with (only spec.runPolicy.suspend applies mid-run). Create a new ScalingRun to use them.")
