"""Object storage that retries: an HTTP server in front of a real SeaweedFS answers 500 (or hangs) a
few times, then forwards. The operator's client (botocore) and the trainer's (pyarrow) get through after
retries, give up after their deadline with a message naming the URI, and fail at once (one request) on
a permanent 4xx. SeaweedFS counts as ready only when it serves a real read."""

from __future__ import annotations

import json
import time
import uuid
from typing import Optional

import pytest

from scalingrun_operator.pull import storage as operator_storage
from scalingrun_operator.local.s3server import serves_reads
from tests.support.flaky_s3 import FlakyS3

pytestmark = pytest.mark.s3

BUCKET = "retry-tests"


@pytest.fixture
def proxies():
    made: list[FlakyS3] = []

    def make(upstream: str, **kwargs) -> FlakyS3:
        made.append(FlakyS3(upstream, **kwargs))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture(scope="module")
def document(s3_server) -> tuple[str, dict]:
    """A small JSON object in a bucket of the real SeaweedFS."""
    import botocore.session
    from botocore.config import Config

    s3 = botocore.session.get_session().create_client(
        "s3", endpoint_url=s3_server.endpoint, region_name="us-east-1", aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key, config=Config(s3={"addressing_style": "path"}))
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    body = {"state": "running", "epoch": 3}
    key = f"runs/{uuid.uuid4().hex[:8]}/progress.json"
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())
    return f"s3://{BUCKET}/{key}", body


# One client cache for the module, as the operator keeps one for its lifetime (its botocore session is made once).
CLIENTS = operator_storage.Clients()


def target(server, endpoint: str, *, secret: Optional[str] = None, access: Optional[str] = None,
           timeout: float = 5.0, deadline: float = 20.0) -> operator_storage.StorageTarget:
    credentials = operator_storage.Credentials(access or server.access_key, secret or server.secret_key)
    return operator_storage.StorageTarget(endpoint, "us-east-1", credentials, timeout, deadline, clients=CLIENTS)


# --- the operator's client (botocore) ------------------------------------------------------------


def test_operator_read_succeeds_after_two_500s(s3_server, document, proxies):
    uri, body = document
    proxy = proxies(s3_server.endpoint, fail=2)
    assert operator_storage.read_json(uri, target(s3_server, proxy.endpoint)) == body
    assert proxy.statuses() == [500, 500, 200]

    listing = proxies(s3_server.endpoint, fail=2)
    folder = uri.rsplit("/", 1)[0]
    assert operator_storage.list_names(folder, target(s3_server, listing.endpoint)) == ["progress.json"]
    assert listing.statuses() == [500, 500, 200]


def test_operator_read_retries_a_timeout(s3_server, document, proxies):
    uri, body = document
    proxy = proxies(s3_server.endpoint, hang=1, hang_seconds=3)
    assert operator_storage.read_json(uri, target(s3_server, proxy.endpoint, timeout=1)) == body
    assert len(proxy.requests) == 2


def test_operator_read_with_500_forever_fails_after_the_deadline(s3_server, document, proxies):
    uri, _ = document
    proxy = proxies(s3_server.endpoint, fail=None)
    started = time.monotonic()
    with pytest.raises(operator_storage.StorageError) as error:
        operator_storage.read_json(uri, target(s3_server, proxy.endpoint, deadline=2))
    elapsed = time.monotonic() - started
    message = str(error.value)
    assert message.startswith(f"cannot read {uri}: InternalError")
    assert "(HTTP 500)" in message and f"attempts in" in message and "storage deadline 2 s" in message
    assert proxy.endpoint in message
    assert 1.0 < elapsed < 10.0, elapsed  # the budget ends it at 2 s; the slack is for a loaded machine
    assert len(proxy.requests) >= 3 and set(proxy.statuses()) <= {500}  # the last may be cut by the budget


@pytest.mark.parametrize("wrong, code, hint", [
    ("access", "InvalidAccessKeyId", "check the access key in the credentials Secret"),
    ("secret", "SignatureDoesNotMatch", "check the secret key in the credentials Secret"),
])
def test_operator_bad_credentials_fail_at_once(s3_server, document, proxies, wrong, code, hint):
    uri, _ = document
    proxy = proxies(s3_server.endpoint)
    bad = target(s3_server, proxy.endpoint, **{wrong: "wrong" + uuid.uuid4().hex})
    with pytest.raises(operator_storage.StorageError) as error:
        operator_storage.read_json(uri, bad)
    assert str(error.value).startswith(f"cannot read {uri}: {code}")
    assert "(HTTP 403)" in str(error.value) and hint in str(error.value)
    assert s3_server.secret_key not in str(error.value)
    assert proxy.statuses() == [403]


def test_operator_missing_bucket_fails_at_once_naming_it(s3_server, proxies):
    proxy = proxies(s3_server.endpoint)
    uri = "s3://no-such-bucket-here/runs/x/progress.json"
    with pytest.raises(operator_storage.StorageError) as error:
        operator_storage.read_json(uri, target(s3_server, proxy.endpoint))
    assert str(error.value).startswith(f"cannot read {uri}: NoSuchBucket")
    assert f"bucket no-such-bucket-here does not exist at {proxy.endpoint}" in str(error.value)
    assert proxy.statuses() == [404]


def test_operator_missing_object_is_none_without_retries(s3_server, proxies):
    proxy = proxies(s3_server.endpoint)
    assert operator_storage.read_json(f"s3://{BUCKET}/absent.json", target(s3_server, proxy.endpoint)) is None
    assert proxy.statuses() == [404]


# --- the trainer's client (pyarrow) ---------------------------------------------------------------


@pytest.fixture
def trainer_env(s3_server, monkeypatch):
    def use(endpoint: str, **overrides: str) -> None:
        env = {**s3_server.env(), "AWS_ENDPOINT_URL": endpoint, **overrides}
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    return use


def test_trainer_reads_and_writes_after_four_500s(s3_server, document, proxies, trainer_env):
    """Four: more than the 3 attempts of the AWS SDK inside pyarrow, so the trainer's own retries count."""
    from scalingrun_trainer.storage import open_location

    uri, body = document
    proxy = proxies(s3_server.endpoint, fail=4)
    trainer_env(proxy.endpoint)
    assert json.loads(open_location(uri).read_bytes()) == body
    assert proxy.statuses()[:4] == [500] * 4 and 200 <= proxy.statuses()[-1] < 300  # a ranged GET: 206

    proxy.fail, proxy.requests[:] = 4, []
    written = uri.rsplit("/", 1)[0] + "/checkpoints/state.json"
    location = open_location(written)
    location.write_bytes_atomic(b'{"epoch": 3}')
    assert proxy.statuses()[:4] == [500] * 4
    assert open_location(written).read_bytes() == b'{"epoch": 3}' and location.exists()


def test_trainer_with_500_forever_fails_after_the_deadline(s3_server, document, proxies, trainer_env):
    from scalingrun_trainer.storage import StorageError, open_location

    uri, _ = document
    proxy = proxies(s3_server.endpoint, fail=None)
    trainer_env(proxy.endpoint, SCALINGRUN_STORAGE_DEADLINE_SECONDS="2")
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        open_location(uri).read_bytes()
    elapsed = time.monotonic() - started
    message = str(error.value)
    assert message.startswith(f"cannot read {uri}: ") and "HTTP status 500" in message
    assert "still failing after" in message and "SCALINGRUN_STORAGE_DEADLINE_SECONDS=2" in message
    assert proxy.endpoint in message
    assert 1.0 < elapsed < 8.0, elapsed
    assert len(proxy.requests) >= 3


@pytest.mark.parametrize("variable", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
def test_trainer_bad_credentials_fail_at_once(s3_server, document, proxies, trainer_env, variable):
    from scalingrun_trainer.storage import StorageError, open_location

    uri, _ = document
    proxy = proxies(s3_server.endpoint)
    trainer_env(proxy.endpoint, **{variable: "wrong" + uuid.uuid4().hex})
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        open_location(uri).read_bytes()
    assert time.monotonic() - started < 2
    message = str(error.value)
    assert message.startswith(f"cannot read {uri}: ") and f"access to bucket {BUCKET} at {proxy.endpoint}" in message
    assert "check the keys AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message
    assert s3_server.secret_key not in message
    assert proxy.statuses() == [403]


def test_trainer_dataset_reads_through_s3fs_outlast_five_500s(s3_server, document, proxies, trainer_env):
    """petastorm reads the Parquet shards through s3fs, which alone gives up after 5 attempts."""
    import s3fs

    from scalingrun_trainer.storage import s3fs_options

    uri, body = document
    proxy = proxies(s3_server.endpoint, fail=5)
    trainer_env(proxy.endpoint)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3fs_options(proxy.endpoint))
    assert json.loads(fs.cat(uri)) == body
    assert proxy.statuses()[:5] == [500] * 5 and proxy.statuses()[-1] == 200


# --- readiness of the local SeaweedFS ---------------------------------------------------------------


def test_a_server_answering_500_is_not_ready_one_serving_reads_is(s3_server, proxies):
    keys = (s3_server.access_key, s3_server.secret_key)
    broken = proxies(s3_server.endpoint, fail=None)
    assert not serves_reads(broken.endpoint, *keys)  # an HTTP answer, but no read
    assert serves_reads(s3_server.endpoint, *keys)
    recovering = proxies(s3_server.endpoint, fail=1)
    assert not serves_reads(recovering.endpoint, *keys) and serves_reads(recovering.endpoint, *keys)
    assert not serves_reads(s3_server.endpoint, s3_server.access_key, "wrong")
