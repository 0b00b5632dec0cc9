"""Tests skip honestly and fail in CI (issue 23, item 7).

A plain clone (no ../shared beside it, no cluster named) runs the test command: the in-cluster part is
skipped, saying why, and the command passes. Any truthy CI makes the same missing part a failure, for
pytest (tests/conftest.py) and for scripts/e2e.sh alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.env import ROOT, TEST_KUBECONFIG_VARIABLE, in_ci

TRUTHY = ["true", "1", "yes", "TRUE", "on", "woodpecker"]  # the last: a CI system's own word
FALSY = ["", "0", "false", "no", "off", "False"]


@pytest.fixture(scope="module")
def plain_clone(tmp_path_factory) -> Path:
    """The tracked files of this checkout, as a clone has them, in a folder with no ../shared beside it."""
    clone = tmp_path_factory.mktemp("elsewhere") / "scalingrun"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            (clone / name).write_bytes(source.read_bytes())
            (clone / name).chmod(source.stat().st_mode)
    assert not (clone.parent / "shared").exists()
    return clone


def _environment(ci: "str | None") -> dict[str, str]:
    """This machine's environment without anything that names a cluster or the workplace's builders."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "KUBEBUILDER_ASSETS", "KUBECONFIG", TEST_KUBECONFIG_VARIABLE)}
    env.update(SCALINGRUN_NODE_DIR="/nonexistent/node", SCALINGRUN_ENVTEST_BUILDER="/nonexistent/build-assets.sh")
    if ci is not None:
        env["CI"] = ci
    return env


@pytest.mark.parametrize("ci", [None, *FALSY])
def test_e2e_in_a_plain_clone_is_skipped_saying_why(plain_clone, ci):
    result = subprocess.run(["bash", "scripts/e2e.sh"], cwd=plain_clone, env=_environment(ci),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "e2e SKIPPED: no cluster: SCALINGRUN_TEST_KUBECONFIG is not set and there is no node cluster at " \
           "/nonexistent/node" in result.stderr
    assert "[setup]" not in result.stderr  # decided before installing anything


@pytest.mark.parametrize("ci", TRUTHY)
def test_e2e_without_a_cluster_fails_with_any_truthy_ci(plain_clone, ci):
    result = subprocess.run(["bash", "scripts/e2e.sh"], cwd=plain_clone, env=_environment(ci),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"e2e FAILED: no cluster" in result.stderr and f"CI={ci} requires the in-cluster tests" in result.stderr


def test_the_test_command_runs_the_e2e_and_keeps_its_status():
    """scripts/test.sh with no arguments runs scripts/e2e.sh (in its background chain), waits for it and exits
    with pytest's or its failure."""
    script = (ROOT / "scripts/test.sh").read_text()
    assert 'phase e2e bash scripts/e2e.sh --junitxml="$BUDGET/e2e.xml"' in script
    assert 'phase "wait: e2e" wait "$BUILDS" || e2e_status=$?' in script
    assert '[[ "$e2e_status" -eq 0 ]] || status=$e2e_status' in script
    assert script.rstrip().endswith('exit "$status"')


def test_python_and_shell_read_ci_alike():
    assert [in_ci(v) for v in TRUTHY] == [True] * len(TRUTHY)
    assert [in_ci(v) for v in [None, *FALSY]] == [False] * (len(FALSY) + 1)


# One test needing a real part that the child pytest below cannot have: an API server.
NEEDS_A_CLUSTER = "tests/integration/test_crd_apiserver.py::test_apiserver_applies_defaults"


@pytest.mark.parametrize("ci,outcome", [("1", "1 error"), ("yes", "1 error"), ("true", "1 error"),
                                        ("0", "1 skipped"), (None, "1 skipped")])
def test_pytest_fails_a_missing_part_with_any_truthy_ci(plain_clone, ci, outcome):
    env = _environment(ci)
    env["SCALINGRUN_CLUSTER_SCRIPT"] = "/nonexistent/cluster.sh"
    result = subprocess.run([sys.executable, "-m", "pytest", NEEDS_A_CLUSTER, "-p", "no:cacheprovider", "-q", "-rs"],
                            cwd=plain_clone, env=env, capture_output=True, text=True, timeout=300)
    assert outcome in result.stdout, result.stdout[-3000:]
    assert "needs KUBEBUILDER_ASSETS" in result.stdout, result.stdout[-3000:]
    assert (result.returncode == 0) == (outcome == "1 skipped"), result.stdout[-3000:]
