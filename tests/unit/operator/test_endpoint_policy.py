"""Without an allow-list the operator sends no request for a run to what only its own pod can reach: cloud metadata
(link-local), loopback, the API server, the cluster's Services; it reads no path of its own disk. A host name is
checked for every address it resolves to, at the connection, and the connection goes to the address checked.
"""

from __future__ import annotations

import http.server
import re
import socket
import threading

import pytest

from scalingrun_operator import config
from scalingrun_operator.pull import endpoint_guard, storage
from scalingrun_operator.pull.store_source import target_of
from scalingrun_operator.schema import endpoints
from scalingrun_operator.schema.endpoints import EndpointPolicy
from tests.support.env import require

POLICY = EndpointPolicy(service_ranges=("10.96.0.0/12",), api_server=("10.96.0.1",))


@pytest.mark.parametrize("address,refused_as", [
    ("169.254.169.254", "link-local"),  # AWS, GCP, Azure, OpenStack metadata
    ("169.254.0.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("::ffff:169.254.169.254", "link-local"),  # the IPv4 address in IPv6 clothing
    ("fd00:ec2::254", "link-local (cloud metadata)"),  # AWS's over IPv6
    ("100.100.100.200", "link-local (cloud metadata)"),  # Alibaba Cloud's
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("10.96.0.1", "the Kubernetes API server"),
    ("10.100.3.4", "Service range 10.96.0.0/12"),
    ("10.244.1.7", None),  # a pod
    ("192.168.1.20", None),  # a store on the company network
    ("52.216.8.10", None),  # AWS S3
    ("minio.storage", None),  # a name: storage resolves it, at the connection
])
def test_address_classes(address, refused_as):
    found = endpoints.address_class(address, POLICY)
    assert (found is None) if refused_as is None else (refused_as in (found or "")), found
    assert endpoints.address_class(address, EndpointPolicy(allow_any=True)) is None


@pytest.mark.parametrize("endpoint,refused", [
    ("http://169.254.169.254", True),
    ("http://[fe80::1]:8333", True),
    ("http://127.0.0.1:8333", True),
    ("http://localhost:9000", True),
    ("http://LOCALHOST.:9000", True),
    ("http://api.localhost", True),
    ("https://10.96.0.1:443", True),
    ("http://10.100.0.9:9000", True),
    ("http://minio.storage:9000", False),
    ("https://s3.eu-west-1.amazonaws.com", False),
    (None, False),
])
def test_literal_endpoints_are_refused_naming_the_field(endpoint, refused):
    refusal = endpoints.endpoint_refusal(endpoint, (), POLICY)
    assert (refusal is not None) == refused, refusal
    if refusal:
        assert refusal.startswith(f"spec.storage.endpoint: {endpoint} is ")
        assert "operator.allowedStorageEndpoints" in refusal
    assert endpoints.endpoint_refusal(endpoint, (), EndpointPolicy(allow_any=True)) is None
    # An allow-list is the administrators' word: what it names is allowed, whatever its address.
    assert endpoints.endpoint_refusal(endpoint, (endpoint or endpoints.AWS_S3_ENDPOINT,), POLICY) is None


def test_paths_are_read_only_by_a_local_run():
    refusal = endpoints.local_path_refusal("spec.dataset.output", "/var/run/secrets/x", EndpointPolicy())
    assert refusal and refusal.startswith("spec.dataset.output: /var/run/secrets/x is a path on the operator's")
    assert endpoints.local_path_refusal("spec.dataset.output", "file:///etc", EndpointPolicy())
    assert endpoints.local_path_refusal("spec.dataset.output", "s3://b/k", EndpointPolicy()) is None
    assert endpoints.local_path_refusal("spec.dataset.output", "/data", EndpointPolicy.anything()) is None
    target = storage.StorageTarget(None, "us-east-1", None, policy=EndpointPolicy())
    for read in (storage.read_json, storage.read_json_versioned, storage.list_names):
        with pytest.raises(storage.EndpointNotAllowed, match="reads s3:// only, not its own disk"):
            read("/etc/hostname", target)


def test_config_defaults_are_safe_and_the_chart_settings_reach_the_policy():
    assert config.Config().endpoint_policy() == EndpointPolicy()
    loaded = config.load({"SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT": "true", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                          "SCALINGRUN_CLUSTER_SERVICE_RANGES": "10.96.0.0/12, fd00:10:96::/112"})
    policy = target_of(loaded, "http://minio:9000", "us-east-1", None, storage.Clients()).policy
    assert policy == EndpointPolicy(allow_any=True, service_ranges=("10.96.0.0/12", "fd00:10:96::/112"),
                                    api_server=("10.96.0.1",))
    with pytest.raises(config.ConfigError, match="SCALINGRUN_CLUSTER_SERVICE_RANGES: '10.96/x' is not a CIDR"):
        config.load({"SCALINGRUN_CLUSTER_SERVICE_RANGES": "10.96/x"})


# --- at the connection: a real HTTP server, real botocore ----------------------------------------------


class _Counting(http.server.BaseHTTPRequestHandler):
    requests = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).requests += 1
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Counting)
    _Counting.requests = 0
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def _client(endpoint: str, policy: EndpointPolicy):
    """The botocore client the operator makes for a store under `policy` (its requests go through
    bounded_http.Transport, which connects through endpoint_guard)."""
    return storage.Clients().get(storage.StorageTarget(endpoint, "us-east-1", storage.Credentials("a", "b"),
                                                       timeout=2, policy=policy))


def test_a_name_that_resolves_to_a_refused_address_gets_no_connection(server):
    # `localhost` resolves through /etc/hosts to loopback: the guard refuses it before connecting.
    with pytest.raises(Exception) as raised:
        _client(f"http://localhost:{server}", POLICY).get_object(Bucket="b", Key="k")
    assert endpoint_guard.refused(raised.value), raised.value
    assert _Counting.requests == 0
    # Storage says only that the endpoint cannot be used, neither why nor how (no port scanner), and tries once.
    # (retrying directly: storage's static check would refuse `localhost` before the guard sees it.)
    target = storage.StorageTarget(f"http://localhost:{server}", "us-east-1", None, deadline=30)
    with pytest.raises(storage.StorageError) as error:
        storage.retrying("read", "s3://b/k", target,
                         lambda: _client(f"http://localhost:{server}", POLICY).get_object(Bucket="b", Key="k"))
    assert "not reachable or not allowed" in str(error.value) and "loopback" not in str(error.value)


def test_refused_and_unresolved_read_the_same(server):
    """Both are retried until the deadline, and then say the same: a run cannot tell a closed port from a name that
    does not resolve. Whether the deadline ended a pause or cut an attempt (a slow lookup on a loaded machine) changes
    only what follows the reason ("; check ..." or ", still failing after ..."), so the reason is compared; the
    deadline is 3 s so that a first lookup or connect at load is not cut before it answers (1 s was, at load 70)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connection refused
    keys = storage.Credentials("a", "b")
    target = storage.StorageTarget(f"http://127.0.0.1:{port}", "us-east-1", keys, timeout=3, deadline=3)
    with pytest.raises(storage.StorageError) as refused:
        storage.read_json("s3://b/k", target)
    target = storage.StorageTarget("http://no-such-host.invalid:9000", "us-east-1", keys, timeout=3, deadline=3)
    with pytest.raises(storage.StorageError) as unresolved:
        storage.read_json("s3://b/k", target)

    def reason(error: pytest.ExceptionInfo) -> str:
        return re.split(r"[;,]", str(error.value).split(": ", 1)[1])[0]

    assert reason(refused) == reason(unresolved) == "the storage endpoint is not reachable or not allowed", \
        (str(refused.value), str(unresolved.value))


def _outbound_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the interface
        except OSError:  # no route at all: loopback only
            return "127.0.0.1"
        return probe.getsockname()[0]


def test_an_allowed_address_is_reached_through_the_guard(server):
    address = _outbound_address()
    require(not endpoints.address_class(address, POLICY),
            f"an address of this machine the policy allows (its outbound one is {address})")
    with pytest.raises(Exception) as raised:  # the server answers 404: the request arrived
        _client(f"http://{address}:{server}", POLICY).get_object(Bucket="b", Key="k")
    assert not endpoint_guard.refused(raised.value)
    assert _Counting.requests == 1


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f000001", "0177.0.0.1"])
def test_loopback_spelt_as_the_resolver_reads_it_gets_no_request(server, host):
    """No literal address to the spec's check, but the resolver reads 127.0.0.1: the connection check refuses it."""
    endpoint = f"http://{host}:{server}"
    assert endpoints.endpoint_refusal(endpoint, (), POLICY) is None
    target = storage.StorageTarget(endpoint, "us-east-1", storage.Credentials("a", "b"), timeout=1, deadline=5,
                                   policy=POLICY)
    with pytest.raises(storage.StorageError, match="the storage endpoint is not reachable or not allowed; check"):
        storage.read_json("s3://bucket/progress.json", target)
    assert _Counting.requests == 0
    # The same server, allowed: the request arrives (the refusal above was the guard's, not a dead port).
    allowed = storage.StorageTarget(endpoint, "us-east-1", storage.Credentials("a", "b"), timeout=1, deadline=5,
                                    policy=EndpointPolicy(allow_any=True))
    assert storage.read_json("s3://bucket/progress.json", allowed) is None  # 404: no such document
    assert _Counting.requests == 1


def test_an_allow_list_is_the_administrators_word_whatever_the_address(server):
    """The chart's defaults (no allow-any) with an allow-list naming a store at loopback: requests go to it."""
    endpoint = f"http://127.0.0.1:{server}"
    target = target_of(config.load({"SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS": endpoint}),
                       endpoint, "us-east-1", storage.Credentials("a", "b"), storage.Clients())
    assert not target.policy.allow_any
    assert storage.read_json("s3://bucket/progress.json", target) is None  # 404: no such document
    assert _Counting.requests == 1
