"""scripts/verify_installed.py, the check docs/security.md runs inside an image: versions against the locks,
files against what pip installed."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
from pathlib import Path

from tests.support.env import ROOT, require

spec = importlib.util.spec_from_file_location("verify_installed", ROOT / "scripts/verify_installed.py")
verify = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verify)
FULL_PROFILE = [ROOT / "requirements" / name for name in ("lock.txt", "bootstrap.txt", "petastorm.txt", "horovod.txt")]


def _installed(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A distribution as pip leaves it: its files and a RECORD with their sha256."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = []
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{relative},sha256={digest},{len(data)}")
    (info / "RECORD").write_text("\n".join(record + [f"{info.name}/RECORD,,"]) + "\n")


def test_this_venv_is_the_lock():
    """The full profile's venv holds exactly the pinned versions (setup.sh installs nothing else)."""
    require(Path(sys.prefix, ".scalingrun-stack").exists(), f"{sys.prefix} is not a venv scripts/setup.sh made")
    assert verify.version_differences(verify.locked(FULL_PROFILE)) == []


def test_a_changed_file_and_a_wrong_version_are_found(tmp_path):
    _installed(tmp_path, "tidy", "1.0", {"tidy/__init__.py": b"x = 1\n", "tidy/core.py": b"y = 2\n"})
    _installed(tmp_path, "other", "2.0", {"other.py": b"z = 3\n"})
    site = [str(tmp_path)]
    assert verify.file_differences([], site) == (3, [])
    (tmp_path / "tidy/core.py").write_bytes(b"y = 'patched'\n")
    assert verify.file_differences([], site) == (3, ["tidy: tidy/core.py differs from what was installed"])
    assert verify.file_differences(["tidy/core.py"], site) == (2, [])
    lock = tmp_path / "lock.txt"
    lock.write_text("tidy==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\nother==2.1\nabsent==3\n")
    assert verify.version_differences(verify.locked([lock]), site) == [
        "other==2.0: installed, the lock pins 2.1", "absent==3: locked, not installed"]
