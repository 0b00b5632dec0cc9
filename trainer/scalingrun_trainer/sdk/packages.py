"""A shipped function's packages (`HorovodRunner(packages=[...])`) and directory (`code_dir=`), installed by pip or
unpacked on every rank before the function is, each into a folder of the cache keyed by a digest (of the list and
this environment, or of the archive), then put first on sys.path.
Only what the environment lacks goes there (`_pip`): the image's own packages stay the ones imported.

The cache is $SCALINGRUN_PACKAGE_CACHE, else <tmp>/scalingrun-packages. A file lock makes the ranks of one machine
install once: the first installs (into a folder of its own, renamed into place when pip has succeeded), the others
wait and reuse it, as does every later run with the same list. pip runs as this Python's `-m pip`, with no shell,
each requirement one argument after `--`; its index is what this environment gives it (PIP_INDEX_URL, PIP_FIND_LINKS,
PIP_NO_INDEX, pip.conf). A failed install is not cached: the next rank or run tries again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from scalingrun_api.shipped import ShippedError, check_requirement
from scalingrun_api.shipped_code import unpack_directory

CACHE_ENV = "SCALINGRUN_PACKAGE_CACHE"
MARKER = "scalingrun-packages.json"  # in an installed folder: the list it holds; written last
CODE_MARKER = ".scalingrun-code"  # in an unpacked shipped directory: written last
PIP_TAIL_LINES = 15  # of pip's output, in the error


class PackagesError(RuntimeError):
    """pip could not install the list: pip's last lines, then a line naming the list and pip's reason."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "scalingrun-packages")


def folder_for(packages: list[str]) -> Path:
    """The list's folder in the cache: what it holds depends on the environment it completes (sys.prefix: two venvs
    of one machine differ), and a wheel is built for one Python and platform."""
    key = json.dumps({"packages": packages, "environment": sys.prefix, "python": sys.implementation.cache_tag,
                      "platform": sys.platform})
    return cache_root() / hashlib.sha256(key.encode()).hexdigest()[:32]


def install(packages: list[str]) -> tuple[Path, bool]:
    """(the folder holding `packages`, whether this call ran pip); PackagesError when pip fails."""
    def run_pip(partial: Path) -> str:
        _pip(packages, partial)
        return json.dumps({"packages": packages}) + "\n"

    return _made_once(folder_for(packages), MARKER, run_pip)


def unpack_code(code: bytes) -> tuple[Path, bool]:
    """(the folder holding a shipped directory, whether this call unpacked it): once a machine per archive's digest."""
    def unpack(partial: Path) -> str:
        unpack_directory(code, partial)
        return ""

    return _made_once(cache_root() / ("code-" + hashlib.sha256(code).hexdigest()[:32]), CODE_MARKER, unpack)


def _made_once(folder: Path, marker: str, fill: Callable[[Path], str]) -> tuple[Path, bool]:
    """(`folder`, whether this call made it): under a file lock, the first caller fills a folder of its own, writes
    `marker` (fill's text) last and renames it into place; the others wait and find the marker. What a killed
    caller left is removed first; a failed fill leaves nothing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if (folder / marker).exists():
            return folder, False
        for left in (folder, *folder.parent.glob(folder.name + ".partial-*")):  # what a killed caller left
            shutil.rmtree(left, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
        try:
            (partial / marker).write_text(fill(partial))
            partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder, True


def _pip(packages: list[str], target: Path) -> None:
    """What the list needs beyond this environment, into `target`. `pip install --target` alone ignores what is
    installed: it would put a second numpy (the newest) first on sys.path, under the image's TensorFlow. So pip
    resolves the list against this environment first (--dry-run, changing nothing), and only the distributions it
    would add or change go into `target`, pinned, without their dependencies (already resolved)."""
    report = target / "pip-report.json"
    _run_pip(packages, ["--dry-run", "--report", str(report)], packages)
    needed = [f"{item['metadata']['name']}=={item['metadata']['version']}"
              for item in json.loads(report.read_text())["install"]]
    report.unlink()
    try:
        for spec in needed:  # what pip resolved goes back to pip: never an option (and not capped: dependencies)
            check_requirement(spec)
    except ShippedError as exc:
        raise PackagesError(f"pip resolved {', '.join(packages)} to {exc}") from None
    if needed:
        _run_pip(needed, ["--target", str(target), "--no-deps"], packages)


def _run_pip(requirements: list[str], options: list[str], packages: list[str]) -> None:
    command = [sys.executable, "-m", "pip", "install", *options, "--no-input", "--disable-pip-version-check",
               "--no-warn-script-location", "--", *requirements]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR:")), lines[-1] if lines else "")
        raise PackagesError("\n".join(lines[-PIP_TAIL_LINES:]) + f"\npip could not install {', '.join(packages)} "
                            f"(exit {done.returncode}): {reason}")


def use(folder: Path) -> None:
    """`folder` first on sys.path, and on PYTHONPATH for the processes the function starts."""
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
