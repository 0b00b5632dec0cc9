"""`scalingrun doctor` under test: its checks as it prints them, and an API server of a test module's own (no
controllers, no kubelet) that the doctor tests bring from empty to ready one fact at a time."""

from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from scalingrun_operator.cli import main
from tests.support.apiserver import api_server
from tests.support.env import require


def doctor(capsys, kubeconfig: str, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Runs `scalingrun doctor` against `kubeconfig`: its exit code, (level, message) per check, and what it printed."""
    capsys.readouterr()  # what an earlier call printed
    code = main(["doctor", "--kubeconfig", kubeconfig, *args])
    out = capsys.readouterr().out
    checks = {}
    for line in out.splitlines():
        level, name, message = line.split(None, 2)
        checks[name] = (level, message)
    return code, checks, out


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory, request) -> Iterator[str]:
    """The kubeconfig of an API server of the test module's own, with no controllers."""
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")), "needs KUBEBUILDER_ASSETS (an API server of its own)")
    state = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-cluster")
    with api_server(state, controllers=False) as path:
        yield path


@pytest.fixture(scope="module")
def api(kubeconfig) -> Any:
    """A client of that API server."""
    from kubernetes import config

    return config.new_client_from_config(config_file=kubeconfig)
