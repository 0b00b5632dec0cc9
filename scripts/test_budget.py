"""Prints the test run's budget: each phase of scripts/test.sh (when it started, how long it took, its exit code)
and the slowest tests of all its pytest phases, from the junit reports scripts/test.sh leaves in FOLDER.

Usage: python scripts/test_budget.py FOLDER [--slowest N]   (FOLDER: .scalingrun/test-budget)
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def phases(folder: Path) -> list[tuple[str, int, int, int]]:
    """(name, started at, took, exit code) in seconds from the start, as scripts/test.sh wrote them."""
    path = folder / "phases.tsv"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, started, took, code = line.split("\t")
        rows.append((name, int(started), int(took), int(code)))
    return sorted(rows, key=lambda row: (row[0] == "in all", row[1]))


def tests(folder: Path) -> tuple[list[tuple[float, str, str]], list[str]]:
    """(seconds, test, phase) of every test case in the phases' junit reports (setup, call and teardown together),
    and the phases whose report could not be read (a phase cut short leaves no complete one)."""
    rows, unread = [], []
    for report in sorted(folder.glob("*.xml")):
        try:
            root = ElementTree.parse(report).getroot()
        except ElementTree.ParseError:
            unread.append(report.stem)
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
            if name.rfind("@") > name.rfind("]"):  # pytest-xdist's group, as --dist loadgroup adds it to the id
                name = name[:name.rfind("@")]
            rows.append((float(case.get("time") or 0), name, report.stem))
    return rows, unread


def render(folder: Path, slowest: int) -> str:
    lines = ["== test budget ==", "| phase | started at | took | exit |", "|---|---|---|---|"]
    for name, started, took, code in phases(folder):
        lines.append(f"| {name} | {minutes(started)} | {minutes(took)} | {code} |")
    cases, unread = tests(folder)
    cases.sort(reverse=True)
    lines += [""] + [f"{phase}: its junit report is incomplete (the phase was cut short); its tests are not counted"
                     for phase in unread]
    lines += [f"{len(cases)} tests reported; the {min(slowest, len(cases))} slowest (setup, call and teardown):",
              "| test | phase | took |", "|---|---|---|"]
    lines += [f"| {name} | {phase} | {seconds:.1f} s |" for seconds, name, phase in cases[:slowest]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args(argv)
    print(render(args.folder, args.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
