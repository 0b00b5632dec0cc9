"""docs/architecture.md names every module of scalingrun_api, scalingrun_operator and scalingrun_trainer: each
module's file (a package: its folder) appears in the block of "The whole tree" under its top package."""

from __future__ import annotations

import re

from tests.support import module_map
from tests.support.env import ROOT

PAGE = ROOT / "docs" / "architecture.md"
TOPS = {"operator/scalingrun/": "scalingrun", "operator/scalingrun_api/": "scalingrun_api", "operator/scalingrun_operator/": "scalingrun_operator",
        "trainer/scalingrun_trainer/": "scalingrun_trainer"}


def whole_tree_blocks() -> dict[str, str]:
    """Top package -> the text of its block in the page's "The whole tree" code block."""
    section = PAGE.read_text().split("## The whole tree", 1)[1].split("```", 2)[1]
    blocks: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        top = next((package for prefix, package in TOPS.items() if line.startswith(prefix)), None)
        if top:
            current = top
        elif line and not line.startswith(" "):
            current = None  # charts/, requirements/, scripts/ ...
        if current:
            blocks[current] = blocks.get(current, "") + line + "\n"
    return blocks


def test_every_module_is_named_in_the_architecture_page():
    blocks = whole_tree_blocks()
    assert set(blocks) == set(TOPS.values()), f"no block for {set(TOPS.values()) - set(blocks)}"
    missing = []
    for name, path in module_map.modules().items():
        top, _, rest = name.partition(".")
        wanted = f"{path.parent.name}/" if path.name == "__init__.py" else path.name
        if rest and not re.search(rf"(?<![\w.]){re.escape(wanted)}", blocks[top]):
            missing.append(f"{name} ({wanted})")
    assert missing == [], f"docs/architecture.md's whole tree does not name: {missing}"


def test_every_file_the_docs_name_under_tests_scripts_or_the_packages_exists():
    """A test file that moved leaves no stale path in the README or docs/."""
    pages = [ROOT / "README.md", ROOT / "charts/scalingrun/README.md", *sorted((ROOT / "docs").glob("*.md"))]
    stale = sorted({f"{page.relative_to(ROOT)}: {path}" for page in pages
                    for path in re.findall(r"(?<![\w/.-])((?:tests|scripts|bench)/[\w/.-]+\.(?:py|sh))", page.read_text())
                    if not (ROOT / path).exists()})
    assert stale == []
