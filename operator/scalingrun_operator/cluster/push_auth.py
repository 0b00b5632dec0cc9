"""Who may push a run's status: a pod of that run, proven by a projected ServiceAccount token of our audience.

The token is checked by the API server (TokenReview with audiences=[STATUS_AUDIENCE]); the pod it is bound to (name
and uid from the review, namespace from the username) must be the run's: labelled as the run's by the operator, in
the run's namespace, with the same uid. Successful reviews are kept briefly (bounded, keyed by the token's hash), so
a run's pushes cost the API server one review per token per REVIEW_TTL_SECONDS; a token reviewed successfully before
is `known` (the status server reviews those apart from new tokens). The pod check runs on every push,
against the pod watch's index where it knows the run's pods, else by listing the pod by name.
Every refusal is a Refused with its HTTP status and a reason (the metric's label).
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

from scalingrun_api.models import MANAGED_BY
from scalingrun_api.status_push import STATUS_AUDIENCE
from ..builders.common import RUN_LABEL
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


class PushAuthenticator:
    """Decides whether a bearer token may push the status of run `namespace/name`."""

    def __init__(self, api_client: client.ApiClient,
                 known_pods: Optional[Callable[[str, str], Optional[list[dict[str, Any]]]]] = None,
                 clock: Callable[[], float] = time.monotonic):
        """`known_pods(namespace, run)`: the run's pods as the pod watch knows them (PodIndex.pods; None: not
        known), so that a push from one of them costs no API call; other pods are listed by name."""
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self._known_pods = known_pods or (lambda namespace, run: None)
        self._clock = clock
        self._reviews: OrderedDict[str, tuple[float, PodIdentity]] = OrderedDict()
        self._guard = threading.Lock()

    def _get_pod(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        # Listed by name: the operator may list pods (the pod watch), not get them.
        found = self.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}", limit=1).items
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
            self._reviews[key] = (now + min(REVIEW_TTL_SECONDS, expires_in(token)), found)
            self._reviews.move_to_end(key)
            while len(self._reviews) > REVIEWS_KEPT:
                self._reviews.popitem(last=False)
        return found

    def authorize(self, authorization: Optional[str], namespace: str, run: str) -> PodIdentity:
        """The pushing pod when it is one of run `namespace/run`'s; Refused otherwise."""
        pod = self.identity(bearer_token(authorization))
        if pod.namespace != namespace:
            raise Refused(403, OTHER_NAMESPACE, f"a pod of namespace {pod.namespace} pushes only for its own")
        known = self._known_pods(namespace, run) or []
        if any((p.get("metadata") or {}).get("uid") == pod.uid for p in known):
            return pod  # the watch's index holds only pods labelled as this run's
        found = self._get_pod(namespace, pod.pod)
        meta = (found or {}).get("metadata") or {}
        if not found or meta.get("uid") != pod.uid:
            raise Refused(401, POD_GONE, f"pod {pod.pod} is gone")
        labels = meta.get("labels") or {}
        if labels.get(RUN_LABEL) != run or any(labels.get(k) != v for k, v in MANAGED_BY.items()):
            raise Refused(403, OTHER_RUN, f"pod {pod.pod} is not a pod of run {run}")
        return pod
