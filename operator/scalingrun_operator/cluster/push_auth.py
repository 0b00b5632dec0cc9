"""Who may push a run's status: a pod of that run, proven by a projected ServiceAccount token of our audience.

The token is checked by the API server (TokenReview with audiences=[STATUS_AUDIENCE]); the pod it is bound to (name
and uid from the review, namespace from the username) must be the run's, by ownership, not by labels (which any
tenant sets): the run exists in the operator's cache (`runs`, from its watch: a made-up name costs no API call), and
the pod's controller chain reaches the run's own Job or MPIJob whose controller is the run, with the run's uid
(`owner_chain`: a preprocessing pod's Job, a worker's MPIJob, a launcher's Job and its MPIJob). Successful reviews
are kept briefly (bounded, keyed by the token's hash), so a run's pushes cost the API server one review per token per
REVIEW_TTL_SECONDS; a token reviewed successfully before is `known` (the status server reviews those apart from new
tokens). The pod check runs on every push, against the pod watch's index where it knows the run's pods, else by
listing the pod by name; the owner chain's verdict is kept as long as a review, its Job and MPIJob read from the
operator's copies, and a kept refusal answers before any pod is listed. Every refusal is a Refused with its HTTP
status and a reason (the metric's label).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kubernetes import client

from scalingrun_api.models import GROUP, KIND, MANAGED_SELECTOR, MPIJOB_GROUP
from scalingrun_api.status_push import STATUS_AUDIENCE
from ..decide.children import controllers
from ..status_server import INVALID_TOKEN, OTHER_RUN, Refused, bearer_token

# A review vouches for its token this long, never past the token's own expiry. The pod check runs on every push, so
# a kept review lets through no pod that is gone or no longer the run's; a minute makes a pod that pushes every 10 s
# cost one TokenReview in six (the API server's own webhook token cache keeps answers 2 min by default).
REVIEW_TTL_SECONDS = 60.0
REVIEWS_KEPT = 4096
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# The reasons a pod's push is refused (the metric's label), beside status_server's NO_TOKEN, INVALID_TOKEN, OTHER_RUN.
WRONG_AUDIENCE, POD_GONE, NOT_A_POD, OTHER_NAMESPACE = "WrongAudience", "PodGone", "NotAPodToken", "OtherNamespace"
UNKNOWN_RUN = "UnknownRun"
# What may stand between a run's pod and the run: its Job (preprocessing; the launcher's, in mpi-operator v0.8) or
# its MPIJob (the workers'), and behind a launcher's Job the MPIJob (docs/security.md, "Who may push").
JOB, MPIJOB = "Job", "MPIJob"
OWNER_GROUPS = {JOB: "batch/", MPIJOB: f"{MPIJOB_GROUP}/"}

Lookup = Callable[[str, str, str], Optional[dict[str, Any]]]  # (kind, namespace, name) -> the object, None: absent


@dataclass(frozen=True)
class PodIdentity:
    namespace: str
    pod: str
    uid: str


def review_token(api_client: client.ApiClient, token: str) -> PodIdentity:
    """The pod `token` is bound to, as the API server vouches for it; Refused when it does not."""
    review = client.AuthenticationV1Api(api_client).create_token_review(client.V1TokenReview(
        spec=client.V1TokenReviewSpec(token=token, audiences=[STATUS_AUDIENCE])))
    status = review.status
    if not status or not status.authenticated:
        error = (status.error if status else "") or "not authenticated"
        lowered = error.lower()
        if "audience" in lowered:
            raise Refused(401, WRONG_AUDIENCE, f"the token is not for audience {STATUS_AUDIENCE}")
        # The API server's words for a token whose bound pod was deleted (or replaced by one of the same name).
        if "invalidated" in lowered or "not found" in lowered or "does not match" in lowered:
            raise Refused(401, POD_GONE, "the pod the token is bound to is gone")
        raise Refused(401, INVALID_TOKEN, "the token is not valid")
    if status.audiences is not None and STATUS_AUDIENCE not in status.audiences:
        raise Refused(401, WRONG_AUDIENCE, f"the token is not for audience {STATUS_AUDIENCE}")
    user = status.user
    username = (user.username if user else "") or ""
    extra = (user.extra if user else None) or {}
    pod, uid = (extra.get(POD_NAME_EXTRA) or [None])[0], (extra.get(POD_UID_EXTRA) or [None])[0]
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not pod or not uid:
        raise Refused(403, NOT_A_POD, "the token is bound to no pod")
    namespace = username[len(SERVICE_ACCOUNT_PREFIX):].split(":", 1)[0]
    return PodIdentity(namespace, pod, uid)


def expires_in(token: str, now: Optional[float] = None) -> float:
    """Seconds until the token's `exp` claim (read after the API server vouched for the token; 0 without one)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return max(0.0, float(claims["exp"]) - (time.time() if now is None else now))
    except (IndexError, ValueError, KeyError, TypeError):
        return 0.0


def _controller(obj: dict[str, Any]) -> Optional[dict[str, Any]]:
    refs = controllers(obj)
    return refs[0] if len(refs) == 1 else None


def _kind(ref: Optional[dict[str, Any]]) -> Optional[str]:
    """ScalingRun, Job or MPIJob when `ref` names one of them (by its API group too), else None."""
    if not ref:
        return None
    kind, api_version = ref.get("kind"), str(ref.get("apiVersion") or "")
    if kind == KIND and api_version.startswith(f"{GROUP}/"):
        return KIND
    return kind if kind in OWNER_GROUPS and api_version.startswith(OWNER_GROUPS[kind]) else None


def owner_chain(pod: dict[str, Any], run_uid: str, lookup: Lookup, reread: Optional[Lookup] = None) -> Optional[str]:
    """None when the pod's controller is the run's own Job or MPIJob (controlled by the run of `run_uid`), or a Job
    controlled by such an MPIJob (a launcher's); else why not. Each owner is looked up and must have the uid its
    reference names: at most two lookups. `reread`: the API server's answer, asked when `lookup` (a copy) has another
    object of the name: a resize's new MPIJob pushes before the operator's watch has shown it."""
    namespace = (pod.get("metadata") or {}).get("namespace") or ""
    ref, kind = _controller(pod), _kind(_controller(pod))
    if kind not in OWNER_GROUPS:
        return "its controller is no Job or MPIJob"

    def uid(found: Optional[dict[str, Any]]) -> Optional[str]:
        return (found.get("metadata") or {}).get("uid") if found else None

    for _ in range(2):
        found = lookup(kind, namespace, ref["name"])
        if reread is not None and uid(found) != ref.get("uid"):
            found = reread(kind, namespace, ref["name"])
        if uid(found) != ref.get("uid"):
            return f"its {kind} {ref['name']} is gone"
        named, ref = f"its {kind} {ref['name']}", _controller(found)
        if _kind(ref) == KIND:
            return None if ref.get("uid") == run_uid else f"{named} is another run's"
        if (kind, _kind(ref)) != (JOB, MPIJOB):  # only a launcher's Job stands behind an MPIJob
            return f"{named} is controlled by no run"
        kind = MPIJOB
    return f"{named} is controlled by no run"


class PushAuthenticator:
    """Decides whether a bearer token may push the status of run `namespace/name`."""

    def __init__(self, api_client: client.ApiClient, runs: Callable[[str, str], Optional[str]],
                 known_pods: Optional[Callable[[str, str], Optional[list[dict[str, Any]]]]] = None,
                 owners: Optional[Lookup] = None, clock: Callable[[], float] = time.monotonic,
                 reread_owners: Optional[Lookup] = None):
        """`runs(namespace, run)`: the run's uid as the operator's watch knows it (KnownRuns.uid; None: no such run).
        `known_pods(namespace, run)`: the run's pods as the pod watch knows them (PodIndex.pods; None: not known),
        so that a push from one of them costs no API call; other pods are listed by name. `owners(kind, namespace,
        name)`: a Job or MPIJob, from the operator's copies where it has them (LatestObjects.child); else read.
        `reread_owners`: the same from the API server, for a copy of another object of the name (owner_chain)."""
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self._runs = runs
        self._known_pods = known_pods or (lambda namespace, run: None)
        if owners is None:
            from .k8s import Kube  # a tool or test without the operator's copies reads each owner
            owners = Kube(api_client).get_child
        self._owners, self._reread_owners = owners, reread_owners
        self._clock = clock
        self._reviews: OrderedDict[str, tuple[float, PodIdentity]] = OrderedDict()
        self._verdicts: OrderedDict[tuple[str, str], tuple[float, Optional[str]]] = OrderedDict()
        self._guard = threading.Lock()

    def _get_pod(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        # Listed by name: the operator may list pods (the pod watch), not get them; and only its own, by label, as
        # every read of pods (a pod without the label is no run's: refused as gone).
        found = self.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}",
                                              label_selector=MANAGED_SELECTOR, limit=1).items
        return self.api_client.sanitize_for_serialization(found[0]) if found else None

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def known(self, authorization: Optional[str]) -> bool:
        """Whether the bearer token's last review vouched for it (however long ago; its pod is still checked): the
        status server reviews such tokens apart from new ones, so that a flood of bad tokens cannot delay them."""
        try:
            token = bearer_token(authorization)
        except Refused:
            return False
        with self._guard:
            return self._key(token) in self._reviews

    def identity(self, token: str) -> PodIdentity:
        """The token's pod, from a recent review or a new one."""
        key = self._key(token)
        now = self._clock()
        with self._guard:
            kept = self._reviews.get(key)
            if kept and kept[0] > now:
                return kept[1]
        try:
            found = review_token(self.api_client, token)
        except Refused:
            with self._guard:
                self._reviews.pop(key, None)  # expired, or its pod gone: a new token from now on
            raise
        with self._guard:
            _keep(self._reviews, key, (now + min(REVIEW_TTL_SECONDS, expires_in(token)), found))
        return found

    def _verdict(self, pod: dict[str, Any], run_uid: str) -> Optional[str]:
        """owner_chain's answer for the pod and run, kept REVIEW_TTL_SECONDS (the pod's own existence is checked on
        every push; its owners' only this often)."""
        key, now = ((pod.get("metadata") or {}).get("uid") or "", run_uid), self._clock()
        with self._guard:
            kept = self._verdicts.get(key)
            if kept and kept[0] > now:
                return kept[1]
        verdict = owner_chain(pod, run_uid, self._owners, self._reread_owners)
        with self._guard:
            _keep(self._verdicts, key, (now + REVIEW_TTL_SECONDS, verdict))
        return verdict

    def _kept_refusal(self, pod_uid: str, run_uid: str) -> Optional[str]:
        """Why the owner chain refused this pod for this run, while that verdict is kept; None otherwise."""
        with self._guard:
            kept = self._verdicts.get((pod_uid, run_uid))
        return kept[1] if kept and kept[0] > self._clock() else None

    def authorize(self, authorization: Optional[str], namespace: str, run: str) -> PodIdentity:
        """The pushing pod when it is one of run `namespace/run`'s; Refused otherwise."""
        pod = self.identity(bearer_token(authorization))
        if pod.namespace != namespace:
            raise Refused(403, OTHER_NAMESPACE, f"a pod of namespace {pod.namespace} pushes only for its own")
        run_uid = self._runs(namespace, run)
        if run_uid is None:  # before any pod or owner is looked at: a made-up name costs nothing
            raise Refused(404, UNKNOWN_RUN, f"this operator knows no run {namespace}/{run}")
        refused = self._kept_refusal(pod.uid, run_uid)
        if refused is not None:  # a refusal needs no fresh pod: a pod pushing for another run costs no pod list
            raise Refused(403, OTHER_RUN, f"pod {pod.pod} is not a pod of run {run}: {refused}")
        known = self._known_pods(namespace, run) or []
        found = next((p for p in known if (p.get("metadata") or {}).get("uid") == pod.uid), None)
        if found is None:  # not in the watch's index of the pods labelled as this run's: listed by name
            found = self._get_pod(namespace, pod.pod)
            if not found or (found.get("metadata") or {}).get("uid") != pod.uid:
                raise Refused(401, POD_GONE, f"pod {pod.pod} is gone, or is none of this operator's pods (no label "
                              f"{MANAGED_SELECTOR})")
        why = self._verdict(found, run_uid)
        if why is not None:
            raise Refused(403, OTHER_RUN, f"pod {pod.pod} is not a pod of run {run}: {why}")
        return pod


def _keep(kept: OrderedDict, key: Any, value: Any) -> None:
    """`kept[key] = value`, the least recently kept dropped beyond REVIEWS_KEPT."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > REVIEWS_KEPT:
        kept.popitem(last=False)
