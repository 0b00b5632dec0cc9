"""HorovodRunner(np=-2, packages=[...]): every rank installs the function's packages with pip before it unpacks it,
into a cache folder keyed by the list (once a machine: one rank installs, the other waits and reuses it; a second run
installs nothing), and a package pip cannot install fails the run naming it, on every rank. No index is reached: pip
reads a folder of wheels this test writes (PIP_NO_INDEX, PIP_FIND_LINKS, passed through as any pip setting is).
HorovodRunner(code_dir=...) the same for a directory of the team's modules, shipped in the payload."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import scalingrun
from tests.support.horovodrun import horovodrun
from tests.support.shipped_ranks import each_rank_fails_alone
from tests.support.wheels import PACKAGE, write_wheel

pytestmark = pytest.mark.horovod


def answer_from_a_shipped_package() -> dict:
    import scalingrun_tiny_answer  # not in this venv: the ranks install it

    return {"answer": scalingrun_tiny_answer.ANSWER, "file": scalingrun_tiny_answer.__file__}


@pytest.fixture
def local_pip(tmp_path, monkeypatch) -> Path:
    """pip with no index, reading tmp_path/wheels; the package cache in tmp_path/cache. Returns the cache."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv("SCALINGRUN_PACKAGE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wheels").mkdir()
    (tmp_path / "runs").mkdir()
    return tmp_path / "cache"


def test_the_ranks_install_the_functions_package_once_and_a_second_run_reuses_it(tmp_path, local_pip, capfd):
    horovodrun()
    requirement = write_wheel(tmp_path / "wheels")
    assert importlib.util.find_spec(PACKAGE) is None  # the function cannot run in this venv as it is
    runner = scalingrun.HorovodRunner(np=-2, workdir=tmp_path / "runs", packages=[requirement])

    value = runner.run(answer_from_a_shipped_package)
    installed = [path for path in local_pip.iterdir() if path.is_dir()]
    assert len(installed) == 1, installed  # one folder for the list: no partial install left behind
    assert value == {"answer": 42, "file": str(installed[0] / PACKAGE / "__init__.py")}
    # Only what the venv lacks: its dependency, installed here, is not a second copy ahead of the venv's.
    assert sorted(path.name for path in installed[0].iterdir()) == [
        "scalingrun-packages.json", PACKAGE, f"{PACKAGE}-1.0.dist-info"]
    first = capfd.readouterr().out
    # The two ranks share this machine: one ran pip, the other waited on the lock and found it installed.
    assert first.count(f"packages installed into {installed[0]}") == 1, first
    assert first.count(f"packages reused from {installed[0]}") == 1, first
    marker = installed[0] / "scalingrun-packages.json"
    before = (marker.stat().st_ino, marker.stat().st_mtime_ns)

    assert runner.run(answer_from_a_shipped_package)["answer"] == 42
    second = capfd.readouterr().out
    assert "packages installed into" not in second and second.count(f"packages reused from {installed[0]}") == 2
    assert (marker.stat().st_ino, marker.stat().st_mtime_ns) == before
    assert [path for path in local_pip.iterdir() if path.is_dir()] == installed


def test_a_package_pip_cannot_install_fails_the_run_naming_it_on_every_rank(tmp_path, local_pip):
    horovodrun()
    missing = "scalingrun-no-such-package==1.0"
    named = (rf"pip could not install {re.escape(missing)} \(exit 1\): "
             rf"ERROR: No matching distribution found for {re.escape(missing)}")
    with pytest.raises(scalingrun.HorovodRunnerError) as raised:
        scalingrun.HorovodRunner(np=-2, workdir=tmp_path / "runs", driver_log_verbosity="log_callback_only",
                                 packages=[missing]).run(answer_from_a_shipped_package)
    # Whichever rank failed first (horovodrun then stops the other) is the one named, with pip's last lines.
    assert re.fullmatch(rf"rank [01] of 2 failed: {named}", str(raised.value).splitlines()[0]), str(raised.value)
    assert "Could not find a version that satisfies the requirement" in str(raised.value)
    # Each rank on its own, as the launcher starts it: it fails naming the package, and nothing is cached.
    each_rank_fails_alone(next((tmp_path / "runs").iterdir()), named)
    assert not [path for path in local_pip.iterdir() if path.is_dir()]


def width_from_the_teams_code() -> dict:
    import teamnets.layers  # only in the shipped code_dir: not on this process's path nor the ranks'

    return {"width": teamnets.layers.width(), "file": teamnets.layers.__file__}


def test_the_ranks_import_the_teams_modules_from_the_shipped_code_dir(tmp_path, local_pip, capfd):
    """HorovodRunner(code_dir=...): the directory travels in the payload, each rank imports from it (unpacked once
    on this machine), and an edit of the code reaches the next run() under a new digest."""
    horovodrun()
    code = tmp_path / "team" / "teamnets"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "layers.py").write_text("def width():\n    return 16\n")
    assert importlib.util.find_spec("teamnets") is None
    runner = scalingrun.HorovodRunner(np=-2, workdir=tmp_path / "runs", code_dir=tmp_path / "team")

    value = runner.run(width_from_the_teams_code)
    unpacked = [path for path in local_pip.iterdir() if path.is_dir()]
    assert len(unpacked) == 1 and value == {"width": 16, "file": str(unpacked[0] / "teamnets" / "layers.py")}
    out = capfd.readouterr().out
    assert out.count(f"shipped code unpacked into {unpacked[0]}") == 1, out
    assert out.count(f"shipped code reused from {unpacked[0]}") == 1, out

    (code / "layers.py").write_text("def width():\n    return 32\n")
    assert runner.run(width_from_the_teams_code)["width"] == 32
