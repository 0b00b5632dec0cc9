"""Checks an installed environment (an image's venv) against the locks: standard library only, so that it
runs with the image's own Python.

1. Versions: every installed distribution is pinned in the locks, at that version, and every pin is installed.
   The project itself (the checkout, `scalingrun`) is the one distribution that no lock names.
2. Files: every file a distribution installed matches the sha256 in its RECORD, written by pip when it
   installed the wheel whose hash the lock pins; a file changed after the install shows here.
   --modified GLOB: files expected to differ (Dockerfile.trainer strips Horovod's debug symbols).

Usage: python verify_installed.py [--modified GLOB]... LOCK [LOCK ...]   (exit 1 on any difference)
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import re
import sys
from importlib import metadata
from pathlib import Path

PROJECT = "scalingrun"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(paths: list[Path]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            text = line.strip().rstrip("\\").strip()
            if text and not text.startswith(("#", "--hash")):
                name, version = text.split("==")
                pins[canonical(name)] = version
    return pins


def _same_version(installed: str, pinned: str) -> bool:
    """2.13.0+cpu is installed as 2.13.0+cpu; a pin without a local label matches any build of its version."""
    return installed == pinned or ("+" not in pinned and installed.split("+")[0] == pinned)


def version_differences(pins: dict[str, str], path: "list[str] | None" = None) -> list[str]:
    found = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(**_where(path))}
    out = [f"{name}=={version}: installed, in no lock" for name, version in sorted(found.items())
           if name not in pins and name != PROJECT]
    out += [f"{name}=={version}: installed, the lock pins {pins[name]}" for name, version in sorted(found.items())
            if name in pins and not _same_version(version, pins[name])]
    out += [f"{name}=={version}: locked, not installed" for name, version in sorted(pins.items()) if name not in found]
    return out


def _where(path: "list[str] | None") -> dict:
    """The environment's site-packages by default: what pip installed there (not a package's vendored copies that
    an import may have put on sys.path; their files are in their package's RECORD)."""
    import sysconfig

    site = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return {"path": path if path is not None else site}


def file_differences(modified: list[str], path: "list[str] | None" = None) -> tuple[int, list[str]]:
    """(files checked, files whose content is not what the wheel installed). Bytecode caches (*.pyc) are
    Python's to rewrite; their sources are checked."""
    checked, out = 0, []
    for dist in metadata.distributions(**_where(path)):
        for entry in dist.files or []:
            if not entry.hash or entry.hash.mode != "sha256":
                continue  # RECORD itself
            if any(fnmatch.fnmatch(str(entry), pattern) for pattern in ["*.pyc", *modified]):
                continue
            path = Path(entry.locate())
            checked += 1
            if not path.is_file():
                out.append(f"{dist.metadata['Name']}: {entry} is missing")
                continue
            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            if digest != entry.hash.value:
                out.append(f"{dist.metadata['Name']}: {entry} differs from what was installed")
    return checked, out


def main(argv: list[str]) -> int:
    modified, locks = [], []
    while argv:
        arg = argv.pop(0)
        if arg == "--modified":
            modified.append(argv.pop(0))
        else:
            locks.append(Path(arg))
    pins = locked(locks)
    versions = version_differences(pins)
    checked, files = file_differences(modified)
    for line in versions + files:
        print(line)
    print(f"{len(pins)} pins, {len(versions)} version differences; {checked} installed files, "
          f"{len(files)} changed or missing")
    return 1 if versions or files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
