"""Pins requirement files to file hashes, for `pip install --require-hashes`.

For each `name==version` in the files it asks pip which file it would install here (`pip install --dry-run
--report`: the index's sha256 for a download, computed for a local file; nothing is installed or built) and
writes that file's sha256 under the pin. The files are the ones for this platform, Linux x86_64 and CPython
3.11: the machines the tests run on and the images (Debian bookworm and Ubuntu 22.04 bases) have it. Another
platform would get other wheels: run scripts/lock.sh there. Existing hashes are replaced; comments stay.

Usage: python scripts/lock_hashes.py [--find-links DIR]... FILE [FILE ...]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read(path: Path) -> tuple[list[str], list[str]]:
    """(the comment lines at the top, the pins `name==version`), hashes and continuations dropped."""
    header, pins = [], []
    for line in path.read_text().splitlines():
        text = line.strip().rstrip("\\").strip()
        if line.startswith("#"):
            if not pins:
                header.append(line)
        elif text and not text.startswith("--hash"):
            pins.append(text.split()[0])
    return header, pins


def hashes(pins: list[str], find_links: list[str]) -> dict[str, str]:
    """sha256 of the file pip picks for each pin, by canonical name."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        links = [arg for link in find_links for arg in ("--find-links", link)]
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "-q",
                        "--disable-pip-version-check", "--report", str(report), *links, *pins], check=True)
        found = {}
        for item in json.loads(report.read_text())["install"]:
            digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
            if not digest:
                raise SystemExit(f"pip reported no sha256 for {item['download_info']['url']}")
            found[canonical(item["metadata"]["name"])] = digest
    missing = [pin for pin in pins if canonical(pin.split("==")[0]) not in found]
    if missing:
        raise SystemExit(f"no file found for {missing}")
    return found


def write(path: Path, header: list[str], pins: list[str], digests: dict[str, str]) -> None:
    lines = header + [f"{pin} \\\n    --hash=sha256:{digests[canonical(pin.split('==')[0])]}" for pin in pins]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> None:
    find_links, files = [], []
    while argv:
        arg = argv.pop(0)
        if arg == "--find-links":
            find_links.append(argv.pop(0))
        else:
            files.append(Path(arg))
    for path in files:
        header, pins = read(path)
        write(path, header, pins, hashes(pins, find_links))
        print(f"hashed {path} ({len(pins)} packages)")


if __name__ == "__main__":
    main(sys.argv[1:])
