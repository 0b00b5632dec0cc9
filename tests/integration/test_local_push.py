"""A local run's status endpoint (local/pushes.py): the operator's request validator on 127.0.0.1, where only the
holder of the run's secret may push, and only that run's documents.

No cluster: a real HTTPS server on loopback, pushed to as the trainer's processes push (the URL, CA and token from
the folder SCALINGRUN_STATUS_DIR names, the path from SCALINGRUN_STATUS_PATH).
"""

from __future__ import annotations

import json
import stat
import sys
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from scalingrun_api.status_push import (
    CA_FILE, HEARTBEAT, PROGRESS, STATUS_DIR_VARIABLE, STATUS_PATH_VARIABLE, TOKEN_FILE, URL_FILE, push_path,
)
from scalingrun_operator.local.pushes import KEY_FILE, LocalPushes
from scalingrun_operator.status_server import INVALID_TOKEN, NO_TOKEN, OTHER_RUN
from tests.support.sdk import config  # noqa: F401 (fixture)
from tests.support.tls import post

BODY = json.dumps({"state": "running", "epoch": 2, "maxEpochs": 3}).encode()


@pytest.fixture
def started_pushes(tmp_path):
    """LocalPushes for run `default/<name>` under tmp_path, started, and stopped after the test."""
    made: list[LocalPushes] = []

    def start(name: str) -> LocalPushes:
        made.append(LocalPushes(tmp_path / "status", "default", name))
        made[-1].start()
        return made[-1]

    yield start
    for pushes in made:
        pushes.stop()


def _endpoint(pushes: LocalPushes) -> tuple[int, Path, str, str]:
    """(port, CA file, the run's push path, the secret), found as a process of the run finds them."""
    env = pushes.environment()
    directory = Path(env[STATUS_DIR_VARIABLE])
    port = urlsplit((directory / URL_FILE).read_text()).port
    return port, directory / CA_FILE, env[STATUS_PATH_VARIABLE], (directory / TOKEN_FILE).read_text()


def test_only_the_runs_secret_pushes_and_only_its_own_runs_documents(tmp_path):
    pushes = LocalPushes(tmp_path / "status", "default", "alpha")
    assert pushes.environment() == {}  # nothing to push to before the run starts
    pushes.start()
    try:
        port, ca, path, secret = _endpoint(pushes)
        assert path == push_path("default", "alpha", "").rstrip("/")
        refused = [
            ("no token", None, path, 401, NO_TOKEN),
            ("a wrong secret", "x" * len(secret), path, 401, INVALID_TOKEN),
            ("the secret with a character changed", secret[:-1] + ("A" if secret[-1] != "A" else "B"), path, 401,
             INVALID_TOKEN),
            ("the secret, for another run", secret, push_path("default", "beta", "").rstrip("/"), 403, OTHER_RUN),
            ("the secret, for another namespace", secret, push_path("team-b", "alpha", "").rstrip("/"), 403,
             OTHER_RUN),
        ]
        for case, token, run_path, status, reason in refused:
            code, answer = post(port, ca, f"{run_path}/{PROGRESS}", BODY, token)
            assert (code, answer.get("reason")) == (status, reason), case
        assert pushes.get(PROGRESS) is None and not pushes.received
        assert post(port, ca, f"{path}/{PROGRESS}", BODY, secret)[0] == 202
        assert pushes.get(PROGRESS).epoch == 2
        assert pushes.received == Counter({PROGRESS: 1})
        assert pushes.refused == Counter({NO_TOKEN: 1, INVALID_TOKEN: 2, OTHER_RUN: 2})
        # The secret and the key are the run's user's alone.
        assert stat.S_IMODE((tmp_path / "status").stat().st_mode) == 0o700
        for private in (TOKEN_FILE, KEY_FILE):
            assert stat.S_IMODE((tmp_path / "status" / private).stat().st_mode) == 0o600, private

        pushes.start()  # a new start (a run started again in the same workdir): a new secret, a new certificate
        port, ca, path, new_secret = _endpoint(pushes)
        assert new_secret != secret
        assert post(port, ca, f"{path}/{HEARTBEAT}", BODY, secret)[0] == 401
        assert pushes.get(HEARTBEAT) is None
    finally:
        pushes.stop()


def test_the_trainers_pusher_reaches_the_local_endpoint_and_a_wrong_secret_does_not(tmp_path, started_pushes):
    """The trainer's own pusher (scalingrun_trainer.core.status_push), in a process of its own with the variables the
    runner gives its processes; the same process with its token file changed is refused and drops the document."""
    pushes = started_pushes("alpha")
    script = ("import json, sys\n"
              "from scalingrun_trainer.core.status_push import status_pusher\n"
              "pusher = status_pusher()\n"
              "pusher.push('heartbeat', {'phase': 'training', 'epoch': 1, 'step': int(sys.argv[1]), 'time': 1.0,"
              " 'rank': 0})\n"
              "assert pusher.flush(60)\n"
              "print(pusher.sent)\n")

    def push_step(step: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", script, str(step)], capture_output=True, text=True, check=True,
                              env={**pushes.environment(), "PYTHONPATH": "operator:trainer"},
                              cwd=Path(__file__).resolve().parents[2])

    sent = push_step(7)
    assert sent.stdout.strip() == "1" and pushes.get(HEARTBEAT).step == 7
    (tmp_path / "status" / TOKEN_FILE).write_text("not-the-runs-secret")
    refused = push_step(8)
    assert refused.stdout.strip() == "0", refused.stderr
    assert "refused a heartbeat push (HTTP 401)" in refused.stderr
    assert pushes.get(HEARTBEAT).step == 7 and pushes.refused == Counter({INVALID_TOKEN: 1})


def test_a_commands_sdk_pushes_rank_0s_heartbeat_and_progress(config, tmp_path, started_pushes):
    """A training.command's rank 0 (the SDK) pushes the run's heartbeat and progress as our trainers' rank 0 does,
    so that a local run's stall watch and status follow a user's script too."""
    pushes = started_pushes("sdk-unit")
    script = ("from scalingrun_trainer import sdk\n"
              "sdk.context()\n"
              "sdk.run._session.heartbeat.phase_floor = 0  # the first beat after 'starting' is sent at once\n"
              "sdk.heartbeat(5, 1)\n"
              "sdk.report_epoch(1, {'loss': 1.0}, 10.0)\n"
              "sdk.finish()\n")
    env = {"PATH": "/usr/bin:/bin", "SCALINGRUN_CONFIG": str(config), "OMPI_COMM_WORLD_RANK": "0",
           "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "PYTHONPATH": "operator:trainer", **pushes.environment()}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    beat, progress = pushes.get(HEARTBEAT), pushes.get(PROGRESS)
    assert beat is not None and (beat.rank, beat.step, beat.epoch) == (0, 5, 1)
    assert progress is not None and (progress.state, progress.epoch) == ("succeeded", 1)
    assert not pushes.refused


def test_a_rerun_of_a_finished_run_pushes_the_document_it_ended_with(tmp_path, started_pushes):
    """A finished run started again trains nothing and writes nothing; rank 0 pushes the progress it ended with
    (core/session.py: Attempt.open), so that a runner fed by pushes sees how it ended instead of no document."""
    recorded = {"state": "succeeded", "epoch": 4, "maxEpochs": 10, "modelUri": "/m/model.keras"}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "progress.json").write_text(json.dumps(recorded))
    pushes = started_pushes("alpha")
    script = ("import sys\n"
              "from scalingrun_trainer.core.progress import push_recorded\n"
              "from scalingrun_trainer.storage import open_location\n"
              "print(push_recorded(open_location(sys.argv[1])))\n")
    env = {**pushes.environment(), "PYTHONPATH": "operator:trainer"}
    for name, sent in (("missing.json", "False"), ("progress.json", "True")):
        result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run" / name)], env=env,
                                capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        assert result.stdout.strip() == sent, result.stderr
    progress = pushes.get(PROGRESS)
    assert (progress.state, progress.epoch, progress.model_uri) == ("succeeded", 4, "/m/model.keras")
