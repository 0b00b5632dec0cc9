"""What a run is held to once it has started: the spec it started with, except runPolicy.suspend.

Children are built from the spec at the moment they are created, and the preprocessing parameters
fix the dataset the trainer reads, so a change of dataset, model, workers (or anything else but
suspend) mid-run would make the parts disagree. The spec seen at the first reconcile is pinned in
`status.pinnedSpec`; later changes are not applied and are reported in a SpecChangeIgnored condition.

The pin lives in status because only the status verb writes status (a create or an update of the run drops
it), so the operator, not whoever may create runs, decides what it holds: a pin a user could write would let
the run use a spec that `kubectl get` does not show and that no admission policy saw. The annotation that held
the pin before (PINNED_ANNOTATION) chooses nothing: a run that carries it is pinned to its `.spec`, the
annotation removed and a Warning Event says so.
"""

from __future__ import annotations

import base64
import copy
import json
import zlib
from typing import Any, Optional

PINNED_FIELD = "pinnedSpec"  # in status
PINNED_ANNOTATION = "scalingrun.dev/pinned-spec"  # where the pin was once kept: ignored, removed
PLAIN_LIMIT = 32 * 1024  # a pin larger than this is kept compressed, so that it does not double the object
_COMPRESSED = "zlib+base64:"
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
    """The status.pinnedSpec value recording the spec a run started with: JSON, compressed past PLAIN_LIMIT."""
    text = json.dumps(_without_live(spec), sort_keys=True, separators=(",", ":"))
    if len(text) <= PLAIN_LIMIT:
        return text
    return _COMPRESSED + base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def pinned_of(body: dict[str, Any]) -> Optional[str]:
    """The pin the operator wrote (status), or None (then the run is pinned again); never the annotation."""
    value = (body.get("status") or {}).get(PINNED_FIELD)
    return value if isinstance(value, str) and _load(value) is not None else None


def annotation_of(body: dict[str, Any]) -> Optional[str]:
    """The old pinned-spec annotation, when the run carries one (written by someone, used by no one)."""
    return ((body.get("metadata") or {}).get("annotations") or {}).get(PINNED_ANNOTATION)


def annotation_ignored_message(spec: dict[str, Any], annotation: str) -> str:
    written = _load(annotation)
    # Only what the annotation names: a field it leaves out is no choice of its writer (.spec has its default).
    differs = [] if written is None else _diff(written, _without_live(spec), "spec", only_old=True)
    if written is None:
        what = "it holds no spec"
    elif differs:
        what = f"it differs from .spec at {', '.join(differs[:8])}" + (" and more" if len(differs) > 8 else "")
    else:
        what = "it matches .spec"
    return (f"the annotation {PINNED_ANNOTATION} chooses nothing and was removed ({what}): the run uses its .spec, "
            f"pinned by the operator in status.{PINNED_FIELD}")


def _load(pinned: Optional[str]) -> Optional[dict[str, Any]]:
    if not pinned:
        return None
    try:
        if pinned.startswith(_COMPRESSED):
            pinned = zlib.decompress(base64.b64decode(pinned[len(_COMPRESSED):]), bufsize=PLAIN_LIMIT).decode()
        value = json.loads(pinned)
    except (ValueError, zlib.error):
        return None  # not a pin the operator wrote: treat as not pinned (re-pinned by the caller)
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


def _diff(old: Any, new: Any, path: str, only_old: bool = False) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) if only_old else set(old) | set(new)):
            out += _diff(old.get(key), new.get(key), f"{path}.{key}", only_old)
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
