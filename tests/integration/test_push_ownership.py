"""A push is tied to its run by ownership, against a real API server (issue 51): the pushing pod's controller chain
must reach the run's own MPIJob or Job, whose controller is the run (by uid), and the run must be one the operator's
watch knows. Labels count for nothing: a pod labelled as the run's but owned by nothing, or by another run's MPIJob,
is refused and nothing is kept; the run's own worker, launcher (through the launcher Job, as mpi-operator v0.8 makes
it) and preprocessing pods are accepted. No operator runs: tests/support/push_runs.py makes what it and the MPI
operator would."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes.client import ApiException

from scalingrun_api.models import GROUP, PLURAL, VERSION
from scalingrun_api.progress import Progress
from scalingrun_api.status_push import PROGRESS, push_path
from scalingrun_operator.cluster import push_auth
from scalingrun_operator.cluster.k8s import Kube
from scalingrun_operator.status_server import OTHER_RUN
from tests.support.push_runs import runs  # noqa: F401 (a fixture)
from tests.support.push_server import push_server
from tests.support.tls import post, write_serving_certificate

pytestmark = pytest.mark.k8s


@pytest.fixture
def server(runs, tmp_path):
    write_serving_certificate(tmp_path / "tls")
    lookups = []
    read = Kube(runs.api_client).get_child

    def owners(kind, namespace, name):  # the API server's answer, each lookup counted
        lookups.append((kind, name))
        return read(kind, namespace, name)

    authenticator = runs.authenticator(owners=owners)
    pods_listed = []
    list_pod = authenticator._get_pod

    def get_pod(namespace, name):  # the API server's answer, each pod list counted
        pods_listed.append(name)
        return list_pod(namespace, name)

    authenticator._get_pod = get_pod
    with push_server(authenticator, tmp_path / "tls") as server:
        server.lookups, server.pods_listed = lookups, pods_listed
        yield server


def _push(server, namespace: str, run: str, token: str, epoch: int) -> tuple[int, dict]:
    body = json.dumps(Progress(epoch=epoch, max_epochs=10).document()).encode()
    return post(server.port, server.ca, push_path(namespace, run, PROGRESS), body, token)


def test_only_the_runs_own_pods_by_owner_chain_may_push_and_a_refusal_keeps_nothing(runs, namespace, server):
    alpha, beta = runs.run(namespace, "alpha"), runs.run(namespace, "beta")
    alpha_mpijob, beta_mpijob = runs.mpijob(alpha), runs.mpijob(beta)
    launcher_job = runs.job("alpha-train-launcher", alpha_mpijob)
    preprocess_job = runs.job("alpha-preprocess", alpha)
    pods = {  # every one labelled as alpha's
        "alpha's worker": runs.pod(namespace, "alpha-train-worker-0", "alpha", alpha_mpijob),
        "alpha's launcher": runs.pod(namespace, "alpha-train-launcher-abcde", "alpha", launcher_job),
        "alpha's preprocessing": runs.pod(namespace, "alpha-preprocess-0-xyz", "alpha", preprocess_job),
        "owned by nothing": runs.pod(namespace, "imposter", "alpha"),
        "beta's worker": runs.pod(namespace, "beta-train-worker-0", "alpha", beta_mpijob),
    }
    tokens = {who: runs.token(pod) for who, pod in pods.items()}

    # Refused first: alpha keeps nothing of theirs.
    for who in ("owned by nothing", "beta's worker"):
        code, answer = _push(server, namespace, "alpha", tokens[who], 9)
        print(f"{who:24} -> {code} {answer}")
        assert (code, answer["reason"]) == (403, OTHER_RUN), who
    # Again and again: the kept refusal answers, before any pod list (a vouched-for token pushing for another run's
    # real name cost the API server a pod list each in the push bench, at any rate).
    listed = len(server.pods_listed)
    for _ in range(5):
        assert "beta-train is another run's" in _push(server, namespace, "alpha", tokens["beta's worker"], 9)[1][
            "message"]
    assert len(server.pods_listed) == listed
    assert server.pushed.get(namespace, "alpha", PROGRESS) is None and server.pushed.held() == (0, 0)

    # Made-up run names, from a pod the API server vouches for: refused before any pod or owner is looked at.
    looked_up = len(server.lookups)
    for index in range(20):
        code, answer = _push(server, namespace, f"made-up-{index}", tokens["alpha's worker"], 1)
        assert (code, answer["reason"]) == (404, push_auth.UNKNOWN_RUN)
    assert len(server.lookups) == looked_up and server.pushed.held() == (0, 0)

    # Each of alpha's own pods is accepted; the owner chain's verdict is kept, so a pod's next push looks up nothing.
    for epoch, who in enumerate(("alpha's worker", "alpha's launcher", "alpha's preprocessing"), start=1):
        assert _push(server, namespace, "alpha", tokens[who], epoch)[0] == 202, who
        assert server.pushed.get(namespace, "alpha", PROGRESS).epoch == epoch
    looked_up = len(server.lookups)
    assert ("Job", "alpha-train-launcher") in server.lookups and ("MPIJob", "alpha-train") in server.lookups
    assert _push(server, namespace, "alpha", tokens["alpha's worker"], 4)[0] == 202
    assert len(server.lookups) == looked_up

    # beta's worker, labelled as alpha's, is beta's: its owner decides, not its label.
    assert _push(server, namespace, "beta", tokens["beta's worker"], 1)[0] == 202
    sample = server.metrics.registry.get_sample_value
    assert sample("scalingrun_status_push_refusals_total", {"reason": OTHER_RUN}) == 7
    assert sample("scalingrun_status_push_refusals_total", {"reason": push_auth.UNKNOWN_RUN}) == 20


def test_a_run_deleted_and_made_again_under_its_name_takes_no_push_from_the_old_ones_pods(runs, namespace, server):
    old = runs.run(namespace, "gamma")
    worker = runs.pod(namespace, "gamma-train-worker-0", "gamma", runs.mpijob(old))
    token = runs.token(worker)
    runs.latest.run_seen("DELETED", old)  # the watch saw it go; its MPIJob and pods are not gone yet
    assert _push(server, namespace, "gamma", token, 1)[1]["reason"] == push_auth.UNKNOWN_RUN
    runs.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gamma",
                                                propagation_policy="Orphan")  # its MPIJob and pods stay
    deadline = time.monotonic() + 60
    while True:  # the garbage collector orphans the children, then the run goes
        try:
            runs.run(namespace, "gamma")  # the same name, a new uid: the old MPIJob's pods are not its pods
            break
        except ApiException as exc:
            if exc.status != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    code, answer = _push(server, namespace, "gamma", token, 1)
    # The garbage collector took the old run's reference off its MPIJob (orphaned): that MPIJob is nobody's now.
    assert (code, answer["reason"]) == (403, OTHER_RUN) and "MPIJob gamma-train is controlled by no run" in answer[
        "message"]
    assert server.pushed.get(namespace, "gamma", PROGRESS) is None
