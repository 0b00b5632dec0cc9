"""Which objects are an owner's children, pure: ours, ours to adopt, or someone else's.

A child's name is derived from its owner's (`<run>-runconfig`, `<run>-preprocess`, `<run>-train`,
`<sweep>-w<N>`), so an object of that name may exist before the owner makes it: left by a deleted
owner of the same name (garbage collection has not removed it yet), by a `scalingrun render | kubectl
apply`, or by anything else. Only an object that carries the owner's labels and has no other
controller is adopted; any other is left untouched, and the owner gets a ChildConflict condition that
names it and says what to do. act checks the same rule (`refusal`) before every patch it sends.
`Claims` applies the rule for one look of a run or a sweep at its children, and sets ChildConflict.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from scalingrun_api.models import GROUP, MANAGED_BY
from ..schema.sweep import POINT_LABEL, SWEEP_LABEL
from ..builders.common import RUN_LABEL
from .snapshot import Patch
from .status import CHILD_CONFLICT, StatusUpdate, get_condition

OURS, ADOPTABLE, FOREIGN = "ours", "adoptable", "foreign"
# The labels that say whose child an object is and what it is for (not e.g. a Kueue queue).
IDENTITY_LABELS = (RUN_LABEL, SWEEP_LABEL, POINT_LABEL, "app.kubernetes.io/component",
                   *MANAGED_BY)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def controllers(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in _meta(obj).get("ownerReferences") or [] if r.get("controller")]


def controlled_by(obj: Mapping[str, Any], owner_uid: Optional[str]) -> bool:
    return any(r.get("uid") == owner_uid for r in controllers(obj))


def controller_name(obj: Mapping[str, Any], kind: str) -> Optional[str]:
    """The name of the scalingrun.dev object of `kind` (ScalingRun, ScalingSweep) that controls `obj`."""
    for ref in controllers(obj):
        if ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return ref.get("name")
    return None


def identity_labels(desired: Mapping[str, Any]) -> dict[str, str]:
    """The labels an existing object must carry to be taken for the child `desired`."""
    labels = _meta(desired).get("labels") or {}
    return {key: labels[key] for key in IDENTITY_LABELS if key in labels}


def ownership(found: Mapping[str, Any], owner_uid: Optional[str], labels: Mapping[str, str]) -> tuple[str, str]:
    """(OURS | ADOPTABLE | FOREIGN, why it is foreign)."""
    if controlled_by(found, owner_uid):
        return OURS, ""
    others = controllers(found)
    if others:
        ref = others[0]
        return FOREIGN, f"belongs to {ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})"
    found_labels = _meta(found).get("labels") or {}
    missing = [f"{key}={value}" for key, value in labels.items() if found_labels.get(key) != value]
    if missing:
        return FOREIGN, f"has no controller but lacks this owner's labels ({', '.join(missing)})"
    return ADOPTABLE, ""


def refusal(found: Mapping[str, Any], owner_uid: Optional[str], adopt: bool, labels: Mapping[str, str]) -> str:
    """Why `found` must not be patched by its would-be owner ('' when it may): it must be controlled by
    the owner, or, for an adoption, have no controller and carry the owner's labels."""
    verdict, why = ownership(found, owner_uid, labels)
    if verdict == OURS or (verdict == ADOPTABLE and adopt):
        return ""
    return why or "has no controller: only an adoption may patch it"


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference to `owner` (as kopf.adopt writes it on the children the operator creates)."""
    meta = _meta(owner)
    return {"controller": True, "blockOwnerDeletion": True, "apiVersion": owner.get("apiVersion"),
            "kind": owner.get("kind"), "name": meta.get("name"), "uid": meta.get("uid")}


def adoption_patch(found: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": [*(_meta(found).get("ownerReferences") or []), owner_reference(owner)]}}


def data_patch(found: Mapping[str, Any], desired: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The patch that brings a ConfigMap's data to what the spec renders (keys it should not have removed)."""
    have, want = found.get("data") or {}, desired.get("data") or {}
    if have == want:
        return None
    return {"data": {**{key: None for key in have if key not in want}, **want}}


def conflict_message(kind: str, namespace: str, name: str, why: str) -> str:
    return (f"{kind} {name} already exists in namespace {namespace} and {why}: it is left untouched, and the "
            f"owner waits for its name. Delete it if it is not needed (kubectl delete {kind.lower()} -n "
            f"{namespace} {name}), or create the owner under another name (its children's names derive from it)")


def child_signature(child: Mapping[str, Any]) -> tuple:
    """What a reconcile reads of a Job or MPIJob (its status, the spec fields read, its controller, whether it
    is going away): a watch event that leaves it unchanged needs no reconcile."""
    meta, spec = _meta(child), child.get("spec") or {}
    return (json.dumps(child.get("status") or {}, sort_keys=True), spec.get("completions"),
            spec.get("completionMode"), (spec.get("runPolicy") or {}).get("suspend"),
            tuple(sorted(r.get("uid", "") for r in controllers(child))), bool(meta.get("deletionTimestamp")))


class Claims:
    """One look of an owner (a run, a sweep) at the objects that hold its children's names: which are its own,
    which it adopts now, and the first held by another."""

    def __init__(self, owner: Mapping[str, Any], namespace: str):
        self.owner, self.namespace = owner, namespace
        self.owned: set[tuple[str, str]] = set()  # (kind, name) the owner holds, adopts or may create now
        self.adopting: set[tuple[str, str]] = set()
        self.conflict: Optional[tuple[str, str, str]] = None  # (kind, name, message) of the first foreign one

    def free(self, kind: str, name: str) -> None:
        """No object holds the name: the owner creates its child under it."""
        self.owned.add((kind, name))

    def claim(self, found: Mapping[str, Any], desired: Mapping[str, Any],
              extra: Optional[dict[str, Any]] = None) -> tuple[str, Optional[Patch]]:
        """(OURS | ADOPTABLE | FOREIGN, the adoption to send: `extra` patched with it). A foreign object is
        left untouched; the first one is what the ChildConflict condition names."""
        kind, name = desired["kind"], _meta(desired)["name"]
        labels = identity_labels(desired)
        verdict, why = ownership(found, _meta(self.owner).get("uid"), labels)
        if verdict == FOREIGN:
            if self.conflict is None:
                self.conflict = (kind, name, conflict_message(kind, self.namespace, name, why))
            return verdict, None
        self.owned.add((kind, name))
        if verdict != ADOPTABLE:
            return verdict, None
        self.adopting.add((kind, name))
        patch = adoption_patch(found, self.owner)
        if extra:
            patch = {**extra, "metadata": {**(extra.get("metadata") or {}), **patch["metadata"]}}
        return verdict, Patch(found, patch, adopt=True, labels=labels)

    def settle(self, update: StatusUpdate, freed: str, named_only: bool = True) -> str:
        """Sets ChildConflict on `update` (a Warning when its message is new); returns the conflict's message
        ('' when none). The condition turns False (`freed`) once the child it names is the owner's, or with
        `named_only` False as soon as no name is taken."""
        existing = get_condition(update.desired["conditions"], CHILD_CONFLICT) or {}
        if self.conflict is not None:
            message = self.conflict[2]
            if existing.get("status") != "True" or existing.get("message") != message:
                update.warn(CHILD_CONFLICT, message)
            update.condition(CHILD_CONFLICT, "True", "NameTaken", message)
            return message
        if existing.get("status") == "True" and (not named_only or any(
                str(existing.get("message") or "").startswith(f"{kind} {name} ") for kind, name in self.owned)):
            update.condition(CHILD_CONFLICT, "False", "NameFree", freed)
        return ""
