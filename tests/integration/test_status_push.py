"""The push path against a real API server: the status endpoint (HTTPS) takes a run's document only from a pod of
that run, proven by a projected ServiceAccount token (TokenRequest bound to the pod, TokenReview by the server).

No kubelet runs: the pods are API objects, and their tokens come from the TokenRequest API bound to them
(boundObjectRef kind Pod), as the kubelet's projected volume would get them.
"""

from __future__ import annotations

import json
import secrets
import ssl
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client

from scalingrun_api.progress import Progress
from scalingrun_api.status_push import MAX_BODY_BYTES, PROGRESS, push_path
from scalingrun_operator.cluster import push_auth
from scalingrun_operator.push_admission import NEW_TOKENS_WAITING, REVIEWS_BUSY, Buckets, NewTokenLine
from scalingrun_operator.status_server import (
    BAD_DOCUMENT, INVALID_TOKEN, NO_TOKEN, OTHER_RUN, RATE_LIMITED, TOO_LARGE, Refused,
)
from tests.support.push_runs import runs  # noqa: F401 (a fixture)
from tests.support.push_server import push_server
from tests.support.tls import post, post_with_headers, write_serving_certificate

pytestmark = pytest.mark.k8s

@pytest.fixture
def other_namespace(api_client):
    core = client.CoreV1Api(api_client)
    name = f"sr-push-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture
def status_server(runs, tmp_path):
    write_serving_certificate(tmp_path / "tls")
    with push_server(runs.authenticator(), tmp_path / "tls") as server:
        yield server


def test_only_a_pod_of_the_run_may_push_its_status(api_client, runs, namespace, other_namespace, status_server):
    core = client.CoreV1Api(api_client)
    own = runs.own_pod(namespace, "alpha-launcher", "alpha")
    other_run = runs.own_pod(namespace, "beta-launcher", "beta")
    elsewhere = runs.own_pod(other_namespace, "alpha-launcher", "alpha")  # the same run name, another namespace
    gone = runs.own_pod(namespace, "alpha-worker-0", "alpha")
    tokens = {"own": runs.token(own), "other run": runs.token(other_run),
              "other namespace": runs.token(elsewhere), "wrong audience": runs.token(own, "someone-else"),
              "deleted pod": runs.token(gone), "no pod": runs.token(own, bound=False)}
    core.delete_namespaced_pod(gone.metadata.name, namespace, grace_period_seconds=0)
    header, payload, signature = tokens["own"].split(".")
    tokens["forged"] = f"{header}.{payload}.{signature[::-1]}"
    tokens["garbage"] = "not-a-token"

    document = Progress(epoch=3, max_epochs=10, metrics={"loss": 0.5}).document()
    path = push_path(namespace, "alpha", PROGRESS)
    table = [  # who pushes, its token, the status and the reason expected
        ("the run's own pod", tokens["own"], 202, None),
        ("another run's pod", tokens["other run"], 403, OTHER_RUN),
        ("another namespace's pod", tokens["other namespace"], 403, push_auth.OTHER_NAMESPACE),
        ("a token of another audience", tokens["wrong audience"], 401, push_auth.WRONG_AUDIENCE),
        ("a token bound to a deleted pod", tokens["deleted pod"], 401, push_auth.POD_GONE),
        ("a token bound to no pod", tokens["no pod"], 403, push_auth.NOT_A_POD),
        ("a forged token", tokens["forged"], 401, INVALID_TOKEN),
        ("garbage", tokens["garbage"], 401, INVALID_TOKEN),
        ("no token", None, 401, NO_TOKEN),
    ]
    found = []
    for who, token, _, _ in table:
        code, answer = post(status_server.port, status_server.ca, path, json.dumps(document).encode(), token)
        found.append((who, code, answer.get("reason")))
        print(f"{who:32} -> {code} {answer.get('reason') or answer}")
    assert found == [(who, code, reason) for who, _, code, reason in table]

    # Only the accepted push was kept and told to on_push; each refusal counted by its reason.
    kept = status_server.pushed.get(namespace, "alpha", PROGRESS)
    assert kept is not None and kept.epoch == 3 and kept.metrics == {"loss": 0.5}
    assert status_server.pushed.get(other_namespace, "alpha", PROGRESS) is None
    assert status_server.pushes == [(namespace, "alpha", PROGRESS)]
    sample = status_server.metrics.registry.get_sample_value
    assert sample("scalingrun_status_pushes_total", {"document": PROGRESS}) == 1
    for reason in {reason for *_, reason in table if reason}:
        expected = sum(1 for *_, r in table if r == reason)
        assert sample("scalingrun_status_push_refusals_total", {"reason": reason}) == expected, reason


def test_the_body_is_capped_parsed_and_pushes_rate_limited(runs, namespace, status_server):
    token = runs.token(runs.own_pod(namespace, "alpha-launcher", "alpha"))
    path = push_path(namespace, "alpha", PROGRESS)
    status_server.buckets = Buckets(rate=0.01, burst=3)  # this run's share: 3 pushes, then one every 100 s

    assert post(status_server.port, status_server.ca, path, b" " * (MAX_BODY_BYTES + 1), token)[0] == 413
    code, answer = post(status_server.port, status_server.ca, path, b"{not json", token)
    assert (code, answer["reason"]) == (400, BAD_DOCUMENT)
    # A body too large is refused before its token is even reviewed: it takes nothing from the run's burst (3), which
    # the bad body and these two spend; the next push is refused until the bucket refills.
    for epoch in (1, 2):
        assert post(status_server.port, status_server.ca, path, json.dumps({"epoch": epoch}).encode(), token)[0] == 202
    code, answer, headers = post_with_headers(status_server.port, status_server.ca, path,
                                              json.dumps({"epoch": 3}).encode(), token)
    assert (code, answer["reason"], headers.get("Retry-After")) == (429, RATE_LIMITED, "1")  # the trainer waits that
    assert status_server.pushed.get(namespace, "alpha", PROGRESS).epoch == 2  # the newest accepted
    sample = status_server.metrics.registry.get_sample_value
    assert sample("scalingrun_status_push_refusals_total", {"reason": TOO_LARGE}) == 1


def test_a_flood_of_new_tokens_waits_apart_from_the_known_pods_pushes(runs, namespace, status_server):
    known = runs.token(runs.own_pod(namespace, "alpha-worker-0", "alpha"))
    fresh = runs.token(runs.own_pod(namespace, "alpha-worker-1", "alpha"))
    path = push_path(namespace, "alpha", PROGRESS)
    body = json.dumps(Progress(epoch=1).document()).encode()
    assert post(status_server.port, status_server.ca, path, body, known)[0] == 202  # reviewed: known from now on

    # New tokens' reviews held, as when bad tokens come faster than the API server reviews them: every new-token
    # thread busy and the waiting line full (the reviews themselves are the API server's, after the gate). Every push
    # here comes from 127.0.0.1, so that one source may fill the whole line (a source's share and bucket:
    # tests/unit/operator/test_push_admission.py).
    status_server.new_tokens = NewTokenLine(share=1, burst=2 * NEW_TOKENS_WAITING)
    gate, authorize, reviewed = threading.Event(), status_server.authenticator.authorize, []

    def held(authorization, *args):
        if not status_server.authenticator.known(authorization):
            reviewed.append(authorization)
            gate.wait(120)
        return authorize(authorization, *args)

    status_server.authenticator.authorize = held
    bad = [f"{known.rsplit('.', 1)[0]}.{secrets.token_urlsafe(32)}" for _ in range(NEW_TOKENS_WAITING)]
    with ThreadPoolExecutor(NEW_TOKENS_WAITING) as pool:
        flood = [pool.submit(post, status_server.port, status_server.ca, path, body, token) for token in bad]
        deadline = time.monotonic() + 60
        while status_server.new_tokens.waiting < NEW_TOKENS_WAITING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status_server.new_tokens.waiting == NEW_TOKENS_WAITING

        # The known pod's push is reviewed apart and accepted; a new token beyond the line is refused at once.
        assert post(status_server.port, status_server.ca, path, body, known)[0] == 202
        for token in (bad[0], fresh):
            code, answer, headers = post_with_headers(status_server.port, status_server.ca, path, body, token)
            assert (code, answer["reason"], headers.get("Retry-After")) == (429, REVIEWS_BUSY, "1")
        gate.set()
        assert [future.result()[0] for future in flood] == [401] * NEW_TOKENS_WAITING
    assert status_server.new_tokens.waiting == 0
    assert post(status_server.port, status_server.ca, path, body, fresh)[0] == 202  # tried again: reviewed now
    # A token the API server refused is refused again without a review (the refused tokens are kept a while).
    reviews = len(reviewed)
    code, answer = post(status_server.port, status_server.ca, path, body, bad[0])
    assert (code, answer["reason"], len(reviewed)) == (401, push_auth.INVALID_TOKEN, reviews)
    refusals = status_server.metrics.registry.get_sample_value
    assert refusals("scalingrun_status_push_refusals_total", {"reason": REVIEWS_BUSY}) == 2
    invalid = refusals("scalingrun_status_push_refusals_total", {"reason": push_auth.INVALID_TOKEN})
    assert invalid == NEW_TOKENS_WAITING + 1  # the flood, and the one refused from the cache


def test_a_rotated_certificate_is_served_without_a_restart(status_server, tmp_path):
    before = ssl.get_server_certificate(("127.0.0.1", status_server.port))
    time.sleep(0.01)
    write_serving_certificate(tmp_path / "tls")  # a new CA and certificate, as a renewed Secret
    assert status_server.reload_certificate()
    after = ssl.get_server_certificate(("127.0.0.1", status_server.port))
    assert after != before
    assert not status_server.reload_certificate()  # nothing changed since


# --- the trainer's side -------------------------------------------------------------------------------


def _mounted(directory: Path, port: int, ca: Path, token: str) -> Path:
    """What the kubelet mounts into a run's pod: the token, the endpoint's URL and CA bundle."""
    directory.mkdir()
    (directory / "token").write_text(token)
    (directory / "url").write_text(f"https://127.0.0.1:{port}")
    (directory / "ca.crt").write_bytes(ca.read_bytes())
    return directory


def test_the_trainers_pushes_reach_the_run_newest_first(runs, namespace, status_server, tmp_path, monkeypatch):
    from scalingrun_trainer.core import status_push

    token = runs.token(runs.own_pod(namespace, "alpha-worker-0", "alpha"))
    mounted = _mounted(tmp_path / "status", status_server.port, status_server.ca, token)
    monkeypatch.setenv(status_push.STATUS_DIR_VARIABLE, str(mounted))
    monkeypatch.setenv(status_push.STATUS_PATH_VARIABLE, f"/v1/namespaces/{namespace}/scalingruns/alpha")
    status_push.status_pusher.cache_clear()
    pusher = status_push.status_pusher()
    assert pusher is not None
    started = time.monotonic()
    for epoch in range(1, 31):  # faster than the run's share of pushes: only the newest one need arrive
        pusher.push(PROGRESS, Progress(epoch=epoch, max_epochs=30).document())
    queued = time.monotonic() - started
    assert pusher.flush(60)
    print(f"30 pushes queued in {queued * 1000:.1f} ms; {pusher.sent} sent")
    assert status_server.pushed.get(namespace, "alpha", PROGRESS).epoch == 30
    assert 1 <= pusher.sent <= 30
    status_push.status_pusher.cache_clear()


def test_rank_0s_writers_push_beside_their_write_and_a_shards_heartbeat_does_not(runs, namespace, status_server,
                                                                                 tmp_path, monkeypatch):
    from scalingrun_api.status_push import HEARTBEAT
    from scalingrun_trainer.core import status_push
    from scalingrun_trainer.core.heartbeat import HeartbeatWriter
    from scalingrun_trainer.core.progress import ProgressWriter
    from scalingrun_trainer.storage import open_location

    token = runs.token(runs.own_pod(namespace, "alpha-worker-0", "alpha"))
    monkeypatch.setenv(status_push.STATUS_DIR_VARIABLE,
                       str(_mounted(tmp_path / "status", status_server.port, status_server.ca, token)))
    monkeypatch.setenv(status_push.STATUS_PATH_VARIABLE, f"/v1/namespaces/{namespace}/scalingruns/alpha")
    status_push.status_pusher.cache_clear()
    try:
        shard = HeartbeatWriter(open_location(str(tmp_path / "_heartbeat/shard-00001.json")), rank=1)
        shard.beat("preprocessing", step=7)
        assert status_push.status_pusher().flush(30)
        assert status_server.pushed.get(namespace, "alpha", HEARTBEAT) is None

        beats = HeartbeatWriter(open_location(str(tmp_path / "heartbeat.json")), pushed=True)
        beats.beat("training", step=12, epoch=1)
        writer = ProgressWriter(open_location(str(tmp_path / "progress.json")), max_epochs=5, processes=2,
                                learning_rate=0.002, effective_batch_size=32)
        writer.start()
        writer.epoch(1, {"loss": 0.4}, 100.0, 1, {"loss": 0.4})
        writer.finish("succeeded")  # waits for its last document to be sent
        progress = status_server.pushed.get(namespace, "alpha", PROGRESS)
        assert (progress.state, progress.epoch, progress.metrics) == ("succeeded", 1, {"loss": 0.4})
        assert progress == Progress.read(json.loads((tmp_path / "progress.json").read_text()))  # the same document
        beat = status_server.pushed.get(namespace, "alpha", HEARTBEAT)
        assert (beat.phase, beat.step, beat.epoch) == ("training", 12, 1)
    finally:
        status_push.status_pusher.cache_clear()


def test_the_trainer_waits_out_an_operator_that_is_away(runs, namespace, tmp_path):
    from scalingrun_trainer.core.status_push import StatusPusher
    from tests.support.apiserver import free_port

    token = runs.token(runs.own_pod(namespace, "alpha-launcher", "alpha"))
    write_serving_certificate(tmp_path / "tls")
    port = free_port()
    said: list[str] = []
    pusher = StatusPusher(f"https://127.0.0.1:{port}", f"/v1/namespaces/{namespace}/scalingruns/alpha",
                          tmp_path / "tls/ca.crt", _mounted(tmp_path / "status", port, tmp_path / "tls/ca.crt",
                                                            token) / "token", log=said.append)
    pusher.push(PROGRESS, Progress(epoch=1).document())  # nobody listens: kept, tried again later
    assert not pusher.flush(0.5)
    assert len(said) == 1 and "does not answer" in said[0]
    pusher.push(PROGRESS, Progress(epoch=2).document())
    with push_server(runs.authenticator(), tmp_path / "tls", port=port) as server:
        assert pusher.flush(120)
        assert server.pushed.get(namespace, "alpha", PROGRESS).epoch == 2
        assert len(said) == 1  # said once, however often it tried


def test_the_final_flush_cuts_a_long_backoff_short(runs, namespace, tmp_path, monkeypatch):
    """The end of training waits for its last document through an operator's failover: a sender backing off for
    30 times the flush's wait tries again once a flush waits (in the elastic e2e at load 60 both replicas restarted,
    and a 5 s flush lost the final epochs)."""
    from scalingrun_trainer.core import status_push
    from tests.support.apiserver import free_port

    backoff = 30 * status_push.FINAL_FLUSH_SECONDS  # the flush below ends long before such a backoff would
    monkeypatch.setattr(status_push, "FIRST_BACKOFF_SECONDS", backoff)
    monkeypatch.setattr(status_push, "MAX_BACKOFF_SECONDS", backoff)
    token = runs.token(runs.own_pod(namespace, "alpha-launcher", "alpha"))
    write_serving_certificate(tmp_path / "tls")
    port = free_port()
    pusher = status_push.StatusPusher(f"https://127.0.0.1:{port}", f"/v1/namespaces/{namespace}/scalingruns/alpha",
                                      tmp_path / "tls/ca.crt", _mounted(tmp_path / "status", port,
                                                                        tmp_path / "tls/ca.crt", token) / "token",
                                      log=lambda line: None)
    pusher.push(PROGRESS, Progress(epoch=1).document())  # nobody listens: the sender backs off
    assert not pusher.flush(0.5)
    with push_server(runs.authenticator(), tmp_path / "tls", port=port) as server:
        pusher.push(PROGRESS, Progress(epoch=2, state="succeeded").document())
        assert pusher.flush(status_push.FINAL_FLUSH_SECONDS)
        assert server.pushed.get(namespace, "alpha", PROGRESS).state == "succeeded"


def test_a_review_is_kept_a_minute_and_never_past_the_tokens_expiry(api_client, runs, namespace, monkeypatch):
    core = client.CoreV1Api(api_client)
    pod = runs.own_pod(namespace, "alpha-worker-0", "alpha")
    token = runs.token(pod)  # good for 600 s
    assert 590 < push_auth.expires_in(token) <= 600
    assert push_auth.expires_in(token, now=time.time() + 3600) == 0 and push_auth.expires_in("garbage") == 0
    reviews, review = [], push_auth.review_token
    monkeypatch.setattr(push_auth, "review_token", lambda *args: reviews.append(1) or review(*args))
    now = [0.0]
    authenticator = runs.authenticator(clock=lambda: now[0])
    for now[0] in (0.0, 10.0, 59.0, 61.0, 70.0):  # a pod pushing every 10 s or so
        assert authenticator.authorize(f"Bearer {token}", namespace, "alpha").uid == pod.metadata.uid
    assert len(reviews) == 2  # at 0 and at 61 s
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    with pytest.raises(push_auth.Refused) as refused:  # a kept review lets no gone pod through
        authenticator.authorize(f"Bearer {token}", namespace, "alpha")
    assert refused.value.reason == push_auth.POD_GONE and len(reviews) == 2


def test_the_pod_watchs_index_answers_for_its_runs_pods_and_nothing_else(api_client, runs, namespace):
    from scalingrun_operator.cluster.pod_index import PodIndex

    own, other = runs.own_pod(namespace, "alpha-launcher", "alpha"), runs.own_pod(namespace, "beta-launcher", "beta")
    index = PodIndex(resync_seconds=300)
    index.listing(namespace, "alpha", lambda: [api_client.sanitize_for_serialization(own)])
    authenticator = runs.authenticator(known_pods=index.pods)
    bearer = {pod.metadata.name: f"Bearer {runs.token(pod)}" for pod in (own, other)}
    assert authenticator.authorize(bearer["alpha-launcher"], namespace, "alpha").uid == own.metadata.uid
    with pytest.raises(Refused) as refused:  # not in alpha's index: read, and found to be beta's
        authenticator.authorize(bearer["beta-launcher"], namespace, "alpha")
    assert refused.value.reason == OTHER_RUN
