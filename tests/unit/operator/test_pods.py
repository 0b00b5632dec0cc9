"""Pod diagnosis and restart counting, on pod documents as the kubelet and the scheduler write them."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from scalingrun_operator.cluster.memory import Memory
from scalingrun_operator.decide import interruptions, pod_facts, pods
from scalingrun_operator.documents import parse_progress
from tests.support.decide_pods import IMAGE, pod, unschedulable, waiting

NS = "ml"
MPIJOB = "demo-train"


# --- diagnosis -------------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_image_pull_failure_names_pod_container_image_and_what_to_do(reason):
    broken = pod("demo-preprocess-x7k2p", "preprocess", phase="Pending",
                 containers=waiting("preprocess", reason, 'Back-off pulling image "registry.example/trainer:missing"'))
    problem, count = pods.diagnose(NS, [broken], (pod_facts.PREPROCESS,))
    assert count == 1 and problem.reason == "ImagePullFailed"
    for part in ("pod demo-preprocess-x7k2p container preprocess", f"image '{IMAGE}'", reason,
                 "check spec.workers.image", "can pull it"):
        assert part in problem.message


def test_missing_secret_key_is_a_container_config_error_pointing_at_the_secret():
    broken = pod("demo-train-worker-0", "worker", phase="Pending", containers=waiting(
        "worker", "CreateContainerConfigError", "couldn't find key AWS_ACCESS_KEY_ID in Secret ml/creds"))
    problem, _ = pods.diagnose(NS, [broken], pod_facts.TRAINING_ROLES, MPIJOB)
    assert problem.reason == "ContainerConfigError"
    assert "couldn't find key AWS_ACCESS_KEY_ID in Secret ml/creds" in problem.message
    assert "spec.storage.credentialsSecret" in problem.message


@pytest.mark.parametrize("role,name,field", [
    ("launcher", "demo-train-launcher-abcde", "spec.launcher.resources"),
    ("worker", "demo-train-worker-1", "spec.workers.cpu/memory"),
    ("preprocess", "demo-preprocess-q2w3e", "spec.dataset.preprocessing.resources"),
])
def test_unschedulable_quotes_the_scheduler_and_names_the_fields_of_that_pod(role, name, field):
    pending = pod(name, role, phase="Pending", containers=[],
                  conditions=unschedulable("0/1 nodes are available: 1 Insufficient cpu."))
    problem, _ = pods.diagnose(NS, [pending], (role,), MPIJOB)
    assert problem.reason == "Unschedulable" and problem.role == role
    assert f"pod {name} cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu." in problem.message
    assert field in problem.message and "add nodes" in problem.message


def test_oom_crash_loop_and_eviction():
    oom = pod("demo-train-worker-0", "worker", containers=waiting(
        "worker", "CrashLoopBackOff", restarts=3, last={"exitCode": 137, "reason": "OOMKilled"}))
    problem, _ = pods.diagnose(NS, [oom], pod_facts.TRAINING_ROLES, MPIJOB)
    assert problem.reason == "OOMKilled" and "exit code 137 (OOMKilled)" in problem.message
    assert "spec.workers.memory" in problem.message

    crash = pod("demo-train-launcher-a1b2c", "launcher", containers=waiting(
        "launcher", "CrashLoopBackOff", restarts=4, last={"exitCode": 1, "reason": "Error"}))
    problem, _ = pods.diagnose(NS, [crash], pod_facts.TRAINING_ROLES, MPIJOB)
    assert problem.reason == "CrashLoopBackOff"
    assert "restarted 4 times, last exit code 1 (Error)" in problem.message
    assert f"kubectl logs -n {NS} demo-train-launcher-a1b2c -c launcher --previous" in problem.message

    evicted = pod("demo-preprocess-zzzzz", "preprocess", phase="Failed", containers=[], reason="Evicted",
                  message="The node was low on resource: memory.")
    problem, _ = pods.diagnose(NS, [evicted], (pod_facts.PREPROCESS,))
    assert problem.reason == "Evicted" and "The node was low on resource: memory." in problem.message


def test_the_most_blocking_problem_wins_and_the_others_are_counted():
    crash = pod("demo-train-worker-0", "worker", containers=waiting("worker", "CrashLoopBackOff", restarts=2))
    pull = pod("demo-train-worker-1", "worker", phase="Pending", containers=waiting("worker", "ErrImagePull"))
    problem, count = pods.diagnose(NS, [crash, pull], pod_facts.TRAINING_ROLES, MPIJOB)
    assert (problem.reason, problem.pod, count) == ("ImagePullFailed", "demo-train-worker-1", 2)
    assert pods.problem_message(problem, count).endswith("(1 more pod with problems)")


def test_healthy_pending_other_roles_and_replaced_failures_are_not_problems():
    running = pod("demo-train-worker-0", "worker")
    unscheduled_yet = pod("demo-train-worker-1", "worker", phase="Pending", containers=[])  # no scheduler verdict
    preprocess_pull = pod("demo-preprocess-aaaaa", "preprocess", phase="Pending",
                          containers=waiting("preprocess", "ErrImagePull"))
    assert pods.diagnose(NS, [running, unscheduled_yet, preprocess_pull], pod_facts.TRAINING_ROLES, MPIJOB) == (None, 0)
    # A Job keeps its failed pods: an OOMKilled pod whose retry is running is history, not a current problem.
    old = pod("demo-preprocess-old00", "preprocess", phase="Failed", created="2026-01-01T12:00:00Z",
              containers=[{"name": "preprocess", "restartCount": 0,
                           "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    retry = pod("demo-preprocess-new00", "preprocess", created="2026-01-01T12:01:00Z")
    assert pods.diagnose(NS, [old, retry], (pod_facts.PREPROCESS,)) == (None, 0)
    assert pods.diagnose(NS, [old], (pod_facts.PREPROCESS,))[0].reason == "OOMKilled"


def test_roles_from_labels_or_from_the_names_the_mpi_operator_gives():
    assert pod_facts.pod_role(pod("x", "worker")) == "worker"
    bare = pod("demo-train-launcher-k8s7x", "launcher")
    del bare["metadata"]["labels"]["training.kubeflow.org/job-role"]
    assert pod_facts.pod_role(bare, MPIJOB) == "launcher"
    bare["metadata"]["name"] = "demo-train-worker-12"
    assert pod_facts.pod_role(bare, MPIJOB) == "worker"
    bare["metadata"]["name"] = "something-else"
    assert pod_facts.pod_role(bare, MPIJOB) == ""
    v03 = pod("pi-worker-0", "worker")
    del v03["metadata"]["labels"]["training.kubeflow.org/job-role"]
    v03["metadata"]["labels"]["mpi-job-role"] = "worker"
    assert pod_facts.pod_role(v03) == "worker"


def test_oom_names_the_containers_memory_limit_or_its_absence():
    oom = pod("demo-train-worker-1", "worker", phase="Running", containers=[
        {"name": "worker", "restartCount": 1, "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    oom["spec"]["containers"][0]["resources"] = {"limits": {"memory": "512Mi", "cpu": "1"}}
    problem, _ = pods.diagnose(NS, [oom], pod_facts.TRAINING_ROLES, MPIJOB)
    assert problem.reason == "OOMKilled" and problem.container == "worker"
    assert problem.message.startswith("pod demo-train-worker-1 container worker was killed for using more memory "
                                      "than its limit of 512Mi (exit code 137 (OOMKilled)); raise spec.workers.memory")
    del oom["spec"]["containers"][0]["resources"]
    problem, _ = pods.diagnose(NS, [oom], pod_facts.TRAINING_ROLES, MPIJOB)
    assert "running out of memory (it has no memory limit: the node ran short)" in problem.message


# --- pods stuck Pending ----------------------------------------------------------------------------

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_pending_too_long_and_when_to_look_again():
    young = pod("demo-train-worker-0", "worker", phase="Pending", containers=[], created="2026-01-01T12:00:30Z")
    old = pod("demo-train-launcher-aaaaa", "launcher", phase="Pending", containers=[], created="2026-01-01T12:00:00Z")
    running = pod("demo-train-worker-1", "worker", created="2026-01-01T11:00:00Z")
    going = pod("demo-train-worker-2", "worker", phase="Pending", containers=[], created="2026-01-01T11:00:00Z")
    going["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:40Z"
    everything = [young, old, running, going]
    assert pods.pending_too_long(everything, at(40)) == []
    # The older one first reaches the threshold (45 s): look again then, one second late for whole-second stamps.
    assert pods.next_pending_check(everything, at(40)) == 6.0
    assert pods.pending_too_long(everything, at(46)) == [old]
    assert pods.next_pending_check(everything, at(46)) == pytest.approx(45 - 16 + 1)
    assert pods.pending_too_long(everything, at(80)) == [old, young]
    assert pods.next_pending_check(everything, at(80)) is None
    assert pods.next_pending_check([running], at(0)) is None
    assert pods.pending_too_long(everything, at(20), threshold_s=10) == [old]


def test_a_pod_pending_too_long_says_what_it_waits_for_and_the_message_does_not_change():
    unplaced = pod("demo-train-launcher-aaaaa", "launcher", phase="Pending", containers=[])
    assert pods.diagnose(NS, [unplaced], pod_facts.TRAINING_ROLES, MPIJOB, now=at(44)) == (None, 0)
    assert pods.diagnose(NS, [unplaced], pod_facts.TRAINING_ROLES, MPIJOB) == (None, 0)  # without a clock: no verdict
    problem, count = pods.diagnose(NS, [unplaced], pod_facts.TRAINING_ROLES, MPIJOB, now=at(45))
    assert (problem.reason, problem.pod, problem.role, count) == ("PodPending", "demo-train-launcher-aaaaa", "launcher", 1)
    assert problem.message == (
        "pod demo-train-launcher-aaaaa has been Pending since 2026-01-01T12:00:00Z (over 45 s): no scheduler has "
        "placed it yet (spec.schedulerName default-scheduler); check that its scheduler runs and that a node matches "
        "spec.launcher.resources (the spec is pinned when the run starts, so a changed spec needs a new ScalingRun): "
        f"kubectl describe pod -n {NS} demo-train-launcher-aaaaa")
    assert pods.diagnose(NS, [unplaced], pod_facts.TRAINING_ROLES, MPIJOB, now=at(600))[0].message == problem.message

    creating = pod("demo-preprocess-x1y2z", "preprocess", phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "True"}], containers=waiting("preprocess", "ContainerCreating"))
    creating["spec"]["nodeName"] = "node-1"
    problem, _ = pods.diagnose(NS, [creating], (pod_facts.PREPROCESS,), now=at(50))
    assert problem.reason == "PodPending" and problem.container == "preprocess"
    assert ("Pending since 2026-01-01T12:00:00Z (over 45 s): on node node-1, container preprocess "
            "ContainerCreating; its Events say what the kubelet waits for") in problem.message
    assert f"kubectl describe pod -n {NS} demo-preprocess-x1y2z" in problem.message


def test_a_specific_cause_wins_over_pending_too_long():
    unplaced = pod("demo-train-worker-0", "worker", phase="Pending", containers=[])
    pull = pod("demo-train-worker-1", "worker", phase="Pending", containers=waiting("worker", "ImagePullBackOff"))
    problem, count = pods.diagnose(NS, [unplaced, pull], pod_facts.TRAINING_ROLES, MPIJOB, now=at(300))
    assert (problem.reason, problem.pod, count) == ("ImagePullFailed", "demo-train-worker-1", 2)
    verdict = pod("demo-train-worker-2", "worker", phase="Pending", containers=[],
                  conditions=unschedulable("0/3 nodes are available: 3 Insufficient memory."))
    problem, count = pods.diagnose(NS, [verdict], pod_facts.TRAINING_ROLES, MPIJOB, now=at(300))
    assert (problem.reason, count) == ("Unschedulable", 1)


# --- the failed launcher's log ---------------------------------------------------------------------


def test_the_failed_launcher_is_the_one_whose_log_is_read():
    first = pod("demo-train-launcher-aaaaa", "launcher", phase="Failed", created="2026-01-01T12:00:00Z",
                containers=[{"name": "launcher", "restartCount": 0,
                             "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    retry = pod("demo-train-launcher-bbbbb", "launcher", phase="Running", created="2026-01-01T12:05:00Z")
    worker = pod("demo-train-worker-0", "worker")
    assert interruptions.failed_launcher([worker], MPIJOB) is None
    assert interruptions.failed_launcher([worker, retry], MPIJOB) == ("demo-train-launcher-bbbbb", "launcher", "")
    assert interruptions.failed_launcher([first, retry, worker], MPIJOB) == ("demo-train-launcher-aaaaa", "launcher", "")
    retry["status"]["phase"] = "Failed"
    retry["spec"]["nodeName"] = "node-1"
    assert interruptions.failed_launcher([first, retry, worker], MPIJOB) == ("demo-train-launcher-bbbbb", "launcher", "node-1")


def test_log_tail_keeps_the_last_lines_as_a_terminal_shows_them_and_bounds_them():
    log = "".join(f"line {i}\n" for i in range(1, 31)) + "Epoch 1/5\n 1/9 [==>...]\r 9/9 [=====] - loss: 0.5\n\n"
    tail = interruptions.log_tail(log)
    rows = tail.split("\n")
    assert len(rows) == 20 and rows[0] == "line 13" and rows[-2:] == ["Epoch 1/5", " 9/9 [=====] - loss: 0.5"]
    assert interruptions.log_tail("\x1b[31mTraceback\x1b[0m (most recent call last):\x07\r\n") == (
        "Traceback (most recent call last):")
    huge = interruptions.log_tail("x" * 10_000 + "\n" + "".join(f"{'y' * 390}{i}\n" for i in range(19)))
    assert len(huge) <= 4000 and huge.endswith("y18") and "x" not in huge
    assert len(interruptions.log_tail("z" * 10_000)) == 400 and interruptions.log_tail("") == ""
    # mpirun --tag-output's tag before a rank's newline is dropped; the one that names the rank is kept.
    assert interruptions.log_tail("[1,0]<stderr>:ValueError: bad[1,0]<stderr>:\n[1,1]<stdout>:\n") == (
        "[1,0]<stderr>:ValueError: bad\n[1,1]<stdout>:")


def failed_state():
    from scalingrun_operator.decide.mpijob_state import MPIJobState

    return MPIJobState("Failed", "MPIJobFailed", "launcher exited 1")


def test_failure_message_ends_with_the_launchers_log_and_fits_in_a_condition():
    from scalingrun_operator.decide.mpijob_state import mpijob_failure_message

    tail = "\n".join(f"rank 0: step {i}" for i in range(19)) + "\nRuntimeError: boom"
    log = interruptions.LauncherLog("demo-train-launcher-aaaaa", "launcher", tail)
    message = mpijob_failure_message(NS, MPIJOB, failed_state(), None, log)
    assert message.startswith(f"MPIJob {MPIJOB} failed (MPIJobFailed: launcher exited 1); no epoch finished; ")
    assert message.endswith("; last 20 lines of launcher pod demo-train-launcher-aaaaa container launcher:\n"
                            + tail)
    long = interruptions.LauncherLog("p", "launcher", interruptions.log_tail("".join(f"{i:03d} {'w' * 395}\n" for i in range(20))))
    message = mpijob_failure_message(NS, MPIJOB, failed_state(), parse_progress({"error": "e" * 600}), long)
    assert len(message) <= 1900 and message.endswith("019 " + "w" * 395)
    kept = message.split(" container launcher:\n")[1].split("\n")
    assert message.count("; last ") == 1 and f"last {len(kept)} lines of" in message and 1 <= len(kept) < 20


def test_failure_message_names_what_a_pod_said_before_the_log():
    from scalingrun_operator.decide.mpijob_state import mpijob_failure_message

    cause = "pod demo-train-worker-1 container worker was killed for using more memory than its limit of 2Gi"
    message = mpijob_failure_message(NS, MPIJOB, failed_state(), None, interruptions.LauncherLog("p", "launcher", "ORTE"),
                                     cause)
    assert message.endswith(f"; {cause}; last 1 line of launcher pod p container launcher:\nORTE")


def test_failure_message_says_why_there_is_no_log():
    from scalingrun_operator.decide.mpijob_state import mpijob_failure_message

    unreadable = interruptions.LauncherLog("demo-train-launcher-aaaaa", "launcher", "", "HTTP 403: forbidden")
    assert mpijob_failure_message(NS, MPIJOB, failed_state(), None, unreadable).endswith(
        "; the log of launcher pod demo-train-launcher-aaaaa container launcher could not be read (HTTP 403: forbidden)")
    assert mpijob_failure_message(NS, MPIJOB, failed_state(), None, interruptions.LauncherLog("", "", "")).endswith(
        "; no launcher pod is left to read its log from")
    assert mpijob_failure_message(NS, MPIJOB, failed_state(), None, interruptions.LauncherLog("p", "launcher", "")).endswith(
        "; launcher pod p container launcher logged nothing")
    assert "launcher pod" not in mpijob_failure_message(NS, MPIJOB, failed_state(), None)


def test_an_unreachable_api_server_is_a_reason_not_an_error():
    from kubernetes import client

    from scalingrun_operator.cluster.k8s import Kube

    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    text, why = Kube(client.ApiClient(configuration)).read_pod_log_tail(NS, "p", "launcher", timeout=2)
    assert text is None and why.startswith(("MaxRetryError", "NewConnectionError", "ProtocolError")), why
    assert "Connection refused" in why


# --- interruptions ---------------------------------------------------------------------------------


def training_pods(launcher_restarts: int = 0, worker1_uid: str = "w1-a") -> list[dict]:
    launcher = pod("demo-train-launcher-aaaaa", "launcher", containers=[
        {"name": "launcher", "restartCount": launcher_restarts, "state": {"running": {}},
         **({"lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}} if launcher_restarts else {})}])
    return [launcher, pod("demo-train-worker-0", "worker", uid="w0-a"),
            pod("demo-train-worker-1", "worker", uid=worker1_uid)]


def test_first_sight_counts_nothing_and_looking_again_counts_nothing():
    records, found = interruptions.track_interruptions([], training_pods(), MPIJOB)
    assert found == [] and [r["name"] for r in records] == [
        "demo-train-launcher-aaaaa", "demo-train-worker-0", "demo-train-worker-1"]
    assert records[2] == {"name": "demo-train-worker-1", "uid": "w1-a", "role": "worker", "restarts": 0, "lost": False}
    again, found = interruptions.track_interruptions(records, training_pods(), MPIJOB)
    assert found == [] and again == records


def test_a_deleted_worker_is_counted_once_with_its_last_state():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    without = training_pods()[:2]
    records, found = interruptions.track_interruptions(records, without, MPIJOB, hints={"w1-a": "it was Running"})
    assert [(i.role, i.pod, i.reason) for i in found] == [("worker", "demo-train-worker-1", "WorkerPodLost")]
    assert found[0].message.startswith("worker pod demo-train-worker-1 (uid w1-a) was deleted; it was Running;")
    assert "the MPI operator recreates it and the launcher resumes from the last checkpoint" in found[0].message
    # The MPI operator recreates it under the same name: a new pod, nothing more to count.
    records, found = interruptions.track_interruptions(records, training_pods(worker1_uid="w1-b"), MPIJOB)
    assert found == [] and records[2]["uid"] == "w1-b"


def test_a_worker_replaced_while_nobody_watched_is_counted_as_replaced():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    _, found = interruptions.track_interruptions(records, training_pods(worker1_uid="w1-b"), MPIJOB)
    assert len(found) == 1
    assert "worker pod demo-train-worker-1 (uid w1-a) was replaced (new uid w1-b)" in found[0].message


def test_a_terminating_or_evicted_worker_is_counted_when_seen_not_again_when_gone():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    current = training_pods()
    current[2]["metadata"]["deletionTimestamp"] = "2026-01-01T12:05:00Z"
    records, found = interruptions.track_interruptions(records, current, MPIJOB)
    assert len(found) == 1 and "is being deleted; it was Running" in found[0].message
    records, found = interruptions.track_interruptions(records, current[:2], MPIJOB)
    assert found == []

    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    current = training_pods()
    current[1]["status"].update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    records, found = interruptions.track_interruptions(records, current, MPIJOB)
    assert len(found) == 1 and "worker pod demo-train-worker-0 (uid w0-a) was evicted: The node" in found[0].message
    _, found = interruptions.track_interruptions(records, current, MPIJOB)
    assert found == []


def test_launcher_restarts_are_counted_by_difference_with_the_exit_code():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    records, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=1), MPIJOB)
    assert [(i.role, i.reason) for i in found] == [("launcher", "LauncherRestarted")]
    assert "launcher pod demo-train-launcher-aaaaa restarted: container launcher exit code 1 (Error)" in (
        found[0].message)
    assert records[0]["restarts"] == 1
    # Two more while the operator was down: one interruption record, both restarts in its text.
    records, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=3), MPIJOB)
    assert len(found) == 1 and "restarted 2 times" in found[0].message and records[0]["restarts"] == 3


def test_a_launcher_whose_ranks_stopped_on_a_preemption_notice_is_not_a_failure_of_the_code():
    """Exit PREEMPTED_EXIT_CODE: the ranks wrote a checkpoint at their step on SIGTERM. The restart is not counted
    (its cause, a worker deleted or evicted, is), and never against backoffLimit."""
    from scalingrun_api.heartbeat import PREEMPTED_EXIT_CODE

    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    current = training_pods(launcher_restarts=1)
    current[0]["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = PREEMPTED_EXIT_CODE
    records, found = interruptions.track_interruptions(records, current, MPIJOB)
    assert found == [] and records[0]["restarts"] == 1
    assert interruptions.code_cause("launcher", current[0]) == interruptions.EVICTED
    assert interruptions.code_cause("launcher", training_pods(launcher_restarts=1)[0]) == interruptions.LAUNCHER_FAILED


def test_a_lost_worker_and_the_launcher_restart_it_causes_are_one_interruption():
    """A deleted worker ends mpirun, and the launcher's container restarts: one fault, counted once, whether the
    operator sees the restart later or in the same look; a restart beyond that one is counted on its own."""
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    records, found = interruptions.track_interruptions(records, training_pods()[:2], MPIJOB)
    assert [i.reason for i in found] == ["WorkerPodLost"] and records[0]["restarts"] == 1
    records, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=1, worker1_uid="w1-b"), MPIJOB)
    assert found == []
    # The same worker lost again, and the restart seen in the same look.
    records, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=2, worker1_uid="w1-c"), MPIJOB)
    assert [i.reason for i in found] == ["WorkerPodLost"] and records[0]["restarts"] == 2
    # A restart of the launcher's own: counted.
    _, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=3, worker1_uid="w1-c"), MPIJOB)
    assert [i.reason for i in found] == ["LauncherRestarted"]
    # Two restarts after one worker lost: the second is an interruption of its own.
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    records, found = interruptions.track_interruptions(records, training_pods(launcher_restarts=2, worker1_uid="w1-b"), MPIJOB)
    assert sorted(i.reason for i in found) == ["LauncherRestarted", "WorkerPodLost"]


def test_a_new_launcher_pod_counts_the_old_one_lost():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    current = training_pods()
    current[0]["metadata"].update(name="demo-train-launcher-bbbbb", uid="l-b")
    records, found = interruptions.track_interruptions(records, current, MPIJOB)
    assert [(i.role, i.pod, i.reason) for i in found] == [
        ("launcher", "demo-train-launcher-aaaaa", "LauncherRestarted")]
    assert "its Job starts a new launcher pod" in found[0].message


def test_workers_removed_after_the_launcher_succeeded_are_no_interruption():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    done = training_pods()[:1]
    done[0]["status"]["phase"] = "Succeeded"
    _, found = interruptions.track_interruptions(records, done, MPIJOB)
    assert found == []


def test_baseline_while_suspended_counts_nothing_then_or_later():
    records, _ = interruptions.track_interruptions([], training_pods(), MPIJOB)
    paused = interruptions.baseline(training_pods(launcher_restarts=2)[:1], MPIJOB)
    assert paused[0]["restarts"] == 2
    _, found = interruptions.track_interruptions(paused, training_pods(launcher_restarts=2), MPIJOB)
    assert found == []


# --- watch events ----------------------------------------------------------------------------------


def test_only_pod_events_that_change_something_reconcile():
    memory = Memory()
    pod_event_matters, deleted_pod_hints = memory.pod_event_matters, memory.deleted_pods
    first = pod("demo-train-worker-0", "worker", uid="evt-1")
    assert pod_event_matters(None, first) is False  # the initial listing primes
    assert pod_event_matters("MODIFIED", copy.deepcopy(first)) is False  # e.g. only resourceVersion moved
    pulling = copy.deepcopy(first)
    pulling["status"]["containerStatuses"] = waiting("worker", "ErrImagePull")
    assert pod_event_matters("MODIFIED", pulling) is True
    assert pod_event_matters("MODIFIED", pulling) is False
    backoff = copy.deepcopy(first)
    backoff["status"]["containerStatuses"] = waiting("worker", "ImagePullBackOff")
    assert pod_event_matters("MODIFIED", backoff) is True
    assert pod_event_matters("DELETED", backoff) is True
    assert deleted_pod_hints()["evt-1"] == "it was Running"
    assert pod_event_matters("ADDED", pod("demo-train-worker-0", "worker", uid="evt-2")) is True
