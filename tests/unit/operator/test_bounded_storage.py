"""The operator's storage calls against stores that misbehave (tests/support/hostile_store.py, on 127.0.0.1): every
answer is read only up to its cap, no call outlives its budget, an endless listing ends, a redirect is not
followed, the store's text is not echoed, and a store that keeps failing is not asked again for a while."""

from __future__ import annotations

import threading
import time

import pytest

from scalingrun_operator.pull import storage
from scalingrun_operator.pull.bounded_http import ERROR_BODY_CAP, Clients
from scalingrun_operator.pull.store_slots import Busy, Guard

from tests.support.hostile_store import HostileStore, self_signed


@pytest.fixture
def hostile(request):
    stores: list[HostileStore] = []

    def start(behaviour: str, **kwargs) -> HostileStore:
        stores.append(HostileStore(behaviour, **kwargs))
        return stores[-1]

    yield start
    for store in stores:
        store.close()


def target(store: HostileStore, deadline: float = 10.0, timeout: float = 10.0,
           clients: Clients | None = None) -> storage.StorageTarget:
    return storage.StorageTarget(store.endpoint, "us-east-1", storage.Credentials("AKIDEXAMPLE", "s" * 40),
                                 timeout=timeout, deadline=deadline, clients=clients or Clients())


def test_a_huge_error_body_is_read_up_to_its_cap_and_named(hostile):
    store = hostile("huge-error")
    with pytest.raises(storage.StoreMisbehaved) as caught:
        storage.read_json("s3://bucket/run/_manifest.json", target(store))
    assert caught.value.reason == "StorageAnswerTooLarge"
    assert str(caught.value).startswith("cannot read s3://bucket/run/_manifest.json: the store's error answer is "
                                        f"over the operator's cap of {ERROR_BODY_CAP // 1024} KiB for it; not read")
    assert "AccessDenied" not in str(caught.value) and "xxx" not in str(caught.value)
    assert len(store.requests) == 1  # too large is not retried
    # What it sent before the operator hung up: the cap and what the sockets' buffers took, not 200 MiB.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and store.bytes_sent < ERROR_BODY_CAP:
        time.sleep(0.05)
    assert store.bytes_sent < 32 * 1024 * 1024


@pytest.mark.parametrize("behaviour, what", [("trickle-headers", "its answer"), ("trickle-body", "its answer")])
def test_a_trickled_answer_is_cut_at_the_budget(hostile, behaviour, what):
    """Each byte comes well within the 10 s read timeout: only the call's budget (1.5 s) ends it."""
    store = hostile(behaviour, pace=0.1)
    started = time.monotonic()
    with pytest.raises(storage.StoreMisbehaved) as caught:
        storage.read_json("s3://bucket/run/progress.json", target(store, deadline=1.5))
    elapsed = time.monotonic() - started
    assert caught.value.reason == "StorageTooSlow"
    assert f"the store did not finish {what} within the operator's budget of 1.5 s" in str(caught.value)
    assert elapsed < 10, elapsed  # not the read timeout, and not the trickle's end (120 s)


def test_a_watcher_check_is_cut_at_its_own_budget_which_is_too_short_to_call_the_store_slow(hostile):
    """A busy node can make a healthy store miss a 2 s check: the breaker counts slowness only in longer calls."""
    store, clients = hostile("trickle-headers", pace=0.1), Clients(guard=Guard(threshold=2))
    for _ in range(2):
        with pytest.raises(storage.StoreMisbehaved, match="budget of 2 s"):
            storage.changed_since("s3://bucket/run/progress.json", target(store, deadline=30, clients=clients), '"v1"')
    assert clients.guard.open_for(store.endpoint) == 0
    for _ in range(2):
        with pytest.raises(storage.StoreMisbehaved, match="budget of 5 s"):
            storage.read_json("s3://bucket/run/progress.json", target(store, deadline=5, clients=clients))
    assert clients.guard.open_for(store.endpoint) > 0


def test_an_endless_listing_ends_with_what_the_store_did(hostile):
    store = hostile("endless-listing")
    with pytest.raises(storage.StoreMisbehaved) as caught:
        storage.list_names("s3://bucket/run/data/_shards", target(store))
    assert caught.value.reason == "StorageListingEndless"
    assert f"the store answered {1 + storage.EXTRA_PAGES} listing pages with 0 keys and still more to come" in \
        str(caught.value)
    assert len(store.requests) == 1 + storage.EXTRA_PAGES


def test_a_redirect_is_not_followed(hostile):
    elsewhere = hostile("error-text")
    store = hostile("redirect", location=f"{elsewhere.endpoint}/bucket/run/_manifest.json")
    with pytest.raises(storage.StoreMisbehaved) as caught:
        storage.read_json("s3://bucket/run/_manifest.json", target(store))
    assert caught.value.reason == "StorageRedirected"
    assert "the store answered with a redirect (HTTP 307) to another address; the operator does not follow " \
           "redirects" in str(caught.value)
    assert elsewhere.endpoint not in str(caught.value)
    assert len(store.requests) == 1 and elsewhere.requests == []


def test_the_stores_error_text_is_shortened_to_printable_characters(hostile):
    store = hostile("error-text")
    with pytest.raises(storage.StorageError) as caught:
        storage.read_json("s3://bucket/run/_manifest.json", target(store))
    message = str(caught.value)
    assert message.startswith("cannot read s3://bucket/run/_manifest.json: AccessDenied: denied ? ??X-Injected: yes "
                              "yyy")
    assert "(HTTP 403); these credentials may not use bucket bucket" in message
    assert all(" " <= ch <= "~" for ch in message) and len(message) < 600


def test_a_store_that_keeps_failing_is_not_asked_again_until_its_backoff_passed(hostile):
    store = hostile("huge-error")
    clients = Clients(guard=Guard(threshold=2, base=1.0))
    for _ in range(2):
        with pytest.raises(storage.StoreMisbehaved):
            storage.read_json("s3://bucket/run/_manifest.json", target(store, clients=clients))
    assert len(store.requests) == 2
    with pytest.raises(storage.StoreMisbehaved) as caught:
        storage.read_json("s3://bucket/other/_manifest.json", target(store, clients=clients))
    assert caught.value.reason == "StorageAnswerTooLarge"  # what it did last
    assert str(caught.value) == (
        f"cannot read s3://bucket/other/_manifest.json: the store at {store.endpoint} failed the operator's last "
        f"requests (the store's error answer is over the operator's cap of {ERROR_BODY_CAP // 1024} KiB for it; not "
        "read); it is asked again in 1 s")  # not the path of the run that failed: it may be another tenant's
    assert len(store.requests) == 2  # not asked
    while clients.guard.open_for(store.endpoint):
        time.sleep(0.05)
    with pytest.raises(storage.StoreMisbehaved):
        storage.read_json("s3://bucket/run/_manifest.json", target(store, clients=clients))
    assert len(store.requests) == 3  # asked again, failed again: open again, for twice as long
    assert 1.0 < clients.guard.open_for(store.endpoint) <= 2.0


def test_an_endpoint_with_its_share_of_calls_in_flight_is_busy_not_broken(hostile):
    store = hostile("trickle-body", pace=0.1)
    clients = Clients(guard=Guard(per_endpoint=1, wait=0.2))
    first = threading.Thread(target=lambda: pytest.raises(
        storage.StoreMisbehaved, storage.read_json, "s3://bucket/a/progress.json", target(store, clients=clients)))
    first.start()
    while not store.requests:
        time.sleep(0.01)
    with pytest.raises(Busy, match=f"1 requests to {store.endpoint} in flight already") as caught:
        storage.read_json("s3://bucket/b/progress.json", target(store, clients=clients))
    assert caught.value.delay > 0
    assert not isinstance(caught.value, storage.StorageError)  # not the run's condition: try again shortly
    first.join()


def test_https_is_verified_against_the_ca_bundle_and_its_handshake_is_within_the_budget(hostile, tmp_path,
                                                                                      monkeypatch):
    context, ca_file = self_signed(tmp_path)
    store = hostile("healthy", tls=context)
    assert store.endpoint.startswith("https://")
    with pytest.raises(storage.StoreMisbehaved) as caught:  # the store's certificate is not trusted
        storage.read_json("s3://bucket/run/progress.json", target(store))
    assert caught.value.reason == "StorageTLSFailed" and "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    monkeypatch.setenv("AWS_CA_BUNDLE", ca_file)
    assert storage.read_json("s3://bucket/run/progress.json", target(store)) == {"state": "running", "epoch": 1}
    assert storage.changed_since("s3://bucket/run/progress.json", target(store), '"v1"') == (False, '"v1"')
    silent = hostile("trickle-headers")  # plain TCP that never answers a ClientHello
    with pytest.raises(storage.StoreMisbehaved, match="did not finish the TLS handshake within the operator's "
                                                      "budget of 1.5 s"):
        storage.read_json("s3://bucket/run/progress.json", storage.StorageTarget(
            silent.endpoint.replace("http:", "https:"), "us-east-1", storage.Credentials("AKIDEXAMPLE", "s" * 40),
            deadline=1.5))
