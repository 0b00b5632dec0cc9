"""How the training's pod records (interruptions.py) are kept in status, pure: one entry per pod for a small run;
past SUMMARY_AFTER pods, a compact record of every pod, counts by phase and reason, and the few pods that need a
look, so that a run's status stays small at any worker count (a full record is ~160 bytes a pod: 163 KiB for
1,024 workers, sent with every status patch).

The compact record keeps what counting interruptions needs across operator restarts: per pod its name (the
part after the MPIJob's name), the first UID_CHARS characters of its uid (a replacement has another: 1 in 4
billion to miss one), the restarts counted, and whether its loss was counted. ~14 bytes a pod.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from .pod_facts import WORKER, container_statuses, metadata_of, pod_name, pod_role, status_of

SUMMARY_AFTER = 64  # pods up to which status lists a full record of each
LOOK_AT_MOST = 32  # pods listed by name in a summary: those that need a look
COMPACT_AT_MOST = 4096  # pods the compact record holds (~56 KiB); beyond, only those that need a look
UID_CHARS = 8


def same_uid(recorded: str, uid: str) -> bool:
    """Whether a recorded uid (whole, or its first UID_CHARS characters in a compact record) is `uid`'s."""
    if not recorded or not uid:
        return recorded == uid
    return uid == recorded or (len(recorded) == UID_CHARS and uid.startswith(recorded))


def pod_reason(pod: dict[str, Any]) -> str:
    """Why a pod is not simply running, in one word ('' when nothing says): Evicted, ImagePullBackOff, OOMKilled..."""
    status = status_of(pod)
    if status.get("reason"):
        return str(status["reason"])
    for container in container_statuses(pod):
        state = container.get("state") or {}
        for key in ("waiting", "terminated"):
            reason = (state.get(key) or {}).get("reason")
            if reason and reason != "Completed":
                return str(reason)
        last = ((container.get("lastState") or {}).get("terminated") or {}).get("reason")
        if last and last != "Completed":
            return str(last)
    return ""


def _needs_a_look(record: dict[str, Any], pod: Optional[dict[str, Any]]) -> tuple[int, str]:
    """(0 for a pod that needs no look, else a rank: lost first, then restarted, then not running yet)."""
    if record.get("lost"):
        return 3, record["name"]
    if record.get("restarts"):
        return 2, record["name"]
    if pod is not None and (pod_reason(pod) or status_of(pod).get("phase") not in ("Running", "Succeeded")):
        return 1, record["name"]
    return 0, record["name"]


def _short(name: str, mpijob_name: str) -> str:
    prefix = f"{mpijob_name}-"
    return name[len(prefix):] if mpijob_name and name.startswith(prefix) else name


def _compact(records: list[dict[str, Any]], mpijob_name: str) -> str:
    out = []
    for r in records:
        entry = f"{_short(r['name'], mpijob_name)}:{str(r.get('uid', ''))[:UID_CHARS]}:{int(r.get('restarts') or 0)}"
        out.append(entry + (":lost" if r.get("lost") else ""))
    return " ".join(out)


def _expand(text: str, mpijob_name: str) -> list[dict[str, Any]]:
    records = []
    for entry in text.split():
        parts = entry.split(":")
        if len(parts) < 3 or not parts[2].isdigit():
            continue  # not written by this module: dropped, as a record of a pod long gone would be
        short, uid, restarts = parts[0], parts[1], int(parts[2])
        name = f"{mpijob_name}-{short}" if mpijob_name and short.startswith(("worker-", "launcher")) else short
        role = WORKER if short.startswith("worker-") else "launcher"
        records.append({"name": name, "uid": uid, "role": role, "restarts": restarts, "lost": parts[3:] == ["lost"]})
    return records


def records_of(training_status: dict[str, Any], mpijob_name: str) -> list[dict[str, Any]]:
    """The pod records status holds, whichever way it holds them."""
    if training_status.get("podRecords"):
        return _expand(str(training_status["podRecords"]), mpijob_name)
    return [dict(r) for r in training_status.get("pods") or []]


def keep(training_status: dict[str, Any], records: list[dict[str, Any]], pods: list[dict[str, Any]],
         mpijob_name: str) -> None:
    """Writes `records` into `training_status`: each in full for a small run, else compact and summarised."""
    if len(records) <= SUMMARY_AFTER:
        training_status["pods"] = records
        training_status.pop("podRecords", None)
        training_status.pop("podSummary", None)
        return
    by_name = {pod_name(p): p for p in pods if pod_role(p, mpijob_name)}
    ranked = sorted(((_needs_a_look(r, by_name.get(r["name"])), r) for r in records),
                    key=lambda t: (-t[0][0], t[0][1]))
    look = [r for (rank, _), r in ranked if rank > 0]
    phases = Counter(status_of(by_name[r["name"]]).get("phase") or "Pending" if r["name"] in by_name else "Gone"
                     for r in records)
    reasons = Counter(reason for r in records if r["name"] in by_name and (reason := pod_reason(by_name[r["name"]])))
    if len(records) > COMPACT_AT_MOST:  # the rest are counted only: a replacement among them goes unnoticed
        kept = sorted(look[:COMPACT_AT_MOST], key=lambda r: r["name"])
    else:
        kept = records
    training_status["pods"] = look[:LOOK_AT_MOST]
    training_status["podRecords"] = _compact(kept, mpijob_name)
    training_status["podSummary"] = {
        "total": len(records), "listed": min(len(look), LOOK_AT_MOST), "needingALook": len(look),
        "phases": dict(sorted(phases.items())), "reasons": dict(sorted(reasons.most_common(20))),
    }


def mark_all_lost(training_status: dict[str, Any], mpijob_name: str) -> None:
    """The recorded MPIJob is gone: every record's loss is counted (as that of the MPIJob)."""
    records = [{**r, "lost": True} for r in records_of(training_status, mpijob_name)]
    keep(training_status, records, [], mpijob_name)
