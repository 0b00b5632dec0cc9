"""The docs hold together: figures quoted from docs/benchmarks.md agree with it, and relative links resolve.

A measured figure lives in one row of docs/benchmarks.md's "Figures quoted elsewhere" table, anchored
`<a id="fig-NAME"></a>`, with its date, machine and settings. Another page quotes it as a link to
`benchmarks.md#fig-NAME` whose text holds the figure: the numbers in the link's text must be the row's value's
numbers, in the same order. A new measurement changes the row, and every quote that still says the old figure
fails here. The charts' README is held to values.yaml the same way: every value has its line in the table."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
FIGURES_HEADING = "Figures quoted elsewhere"
PAGES = sorted([ROOT / "README.md", ROOT / "charts" / "scalingrun" / "README.md", *(ROOT / "docs").glob("*.md")])
CHART = ROOT / "charts" / "scalingrun"

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)


def _prose(text: str) -> str:
    """Markdown without fenced blocks and code spans: what is left can hold links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> dict[str, str]:
    """Anchor -> the text of its section (to the next heading of any level, code blocks included)."""
    anchors: dict[str, str] = {}
    seen: dict[str, int] = {}
    anchor, fence = "", None
    for line in path.read_text().splitlines():
        if fence is None and line.startswith(("```", "~~~")):
            fence = line[:3]
        elif fence and line.startswith(fence):
            fence = None
        elif fence is None and re.match(r"#{1,6} ", line):
            slug = _slug(line.lstrip("#"))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchor = slug if count == 0 else f"{slug}-{count}"
            anchors[anchor] = ""
            continue
        if fence is None:
            for match in ANCHOR_TAG.finditer(line):
                anchors[match.group(1)] = line
        anchors[anchor] = anchors.get(anchor, "") + line + "\n"
    return anchors


def _links(path: Path) -> list[tuple[str, str, str]]:
    """(kind "link" or "image", text, target) of every Markdown link and image outside code."""
    return [("image" if bang else "link", text, target)
            for bang, text, target in LINK.findall(_prose(path.read_text()))]


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    path_part, _, anchor = target.partition("#")
    return ((page.parent / path_part).resolve() if path_part else page), anchor


def _figures() -> dict[str, dict[str, str]]:
    """docs/benchmarks.md's table of quoted figures: name -> its cells."""
    section = _anchors(BENCHMARKS)[_slug(FIGURES_HEADING)]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = [line for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:])]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    figures = {}
    for line in rows[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        name = ANCHOR_TAG.search(cells["figure"])
        assert name, f"docs/benchmarks.md, {FIGURES_HEADING}: a row without <a id=\"fig-...\"></a>: {line}"
        figures[name.group(1)] = cells
    return figures


def _quotes() -> list[tuple[Path, str, str]]:
    """(page, link text, figure name) of every link to a figure of docs/benchmarks.md."""
    quotes = []
    for page in PAGES:
        for _, text, target in _links(page):
            path, anchor = _resolve(page, target)
            if path == BENCHMARKS and anchor.startswith("fig-"):
                quotes.append((page, text, anchor))
    return quotes


def test_every_relative_link_and_image_resolves():
    broken = []
    for page in PAGES:
        for kind, text, target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, anchor = _resolve(page, target)
            where = f"{page.relative_to(ROOT)}: {kind} [{text}]({target})"
            if not path.exists():
                broken.append(f"{where}: no file {path.relative_to(ROOT) if ROOT in path.parents else path}")
            elif kind == "image" and not path.is_file():
                broken.append(f"{where}: not a file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{where}: no heading or <a id> '{anchor}' in {path.relative_to(ROOT)}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_every_quoted_figure_has_a_date_a_machine_settings_and_its_measurement():
    figures = _figures()
    assert len(figures) >= 5, figures.keys()
    for name, cells in figures.items():
        assert re.search(r"\b2\d{3}-\d{2}-\d{2}\b", cells["measured"]), f"{name}: no date (YYYY-MM-DD)"
        assert cells["machine"] and cells["settings"], f"{name}: machine and settings must be said"
        assert _numbers(cells["value"]), f"{name}: the value has no number"
        source = LINK.search(cells["source"])
        assert source, f"{name}: the source column must link to the measurement"
        path, anchor = _resolve(BENCHMARKS, source.group(3))
        assert path.exists() and anchor in _anchors(path), f"{name}: source {source.group(3)} does not resolve"
        measured = set(_numbers(_anchors(path)[anchor]))
        missing = [n for n in _numbers(cells["value"]) if n not in measured]
        assert not missing, f"{name}: {missing} of '{cells['value']}' not in the measurement it cites ({source.group(3)})"


def _disagreements(quotes: list[tuple[Path, str, str]], figures: dict[str, dict[str, str]]) -> list[str]:
    wrong = [f"{page.relative_to(ROOT)}: [{text}] quotes {name}, which is not in docs/benchmarks.md"
             for page, text, name in quotes if name not in figures]
    return wrong + [f"{page.relative_to(ROOT)}: [{text}] has numbers {_numbers(text)}; docs/benchmarks.md's {name} "
                    f"says '{figures[name]['value']}' ({_numbers(figures[name]['value'])})"
                    for page, text, name in quotes
                    if name in figures and _numbers(text) != _numbers(figures[name]["value"])]


def test_every_quote_of_a_figure_says_the_figure():
    figures = _figures()
    quotes = _quotes()
    wrong = _disagreements(quotes, figures)
    assert not wrong, "figures that disagree with docs/benchmarks.md:\n" + "\n".join(wrong)
    unquoted = set(figures) - {name for _, _, name in quotes}
    assert not unquoted, f"figures no page quotes (drop them or quote them): {sorted(unquoted)}"


def test_the_readme_quotes_its_speed_figures_from_benchmarks():
    quoted = {name for page, _, name in _quotes() if page.name == "README.md" and page.parent == ROOT}
    assert {"fig-lightning-cpu", "fig-input-readers", "fig-cache-quickstart"} <= quoted, quoted


def test_a_quote_with_other_numbers_or_an_unknown_figure_is_caught():
    """The check itself, on the figures as they are: the issue's stale quotes would fail it."""
    figures = _figures()
    readme = ROOT / "README.md"
    stale = [(readme, "0.25-0.45 x Keras' images/s", "fig-lightning-cpu"),
             (readme, "31 s against 235 s without it (7.6x)", "fig-cache-quickstart"),
             (readme, "1.6-1.7x", "fig-input-readers"),
             (readme, "0.63x", "fig-no-such-figure")]
    assert len(_disagreements(stale, figures)) == len(stale)
    assert not _disagreements([(readme, f"about {figures[n]['value']}", n) for n in figures], figures)


def _value_paths(values: dict, prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths += _value_paths(value, path + ".") if isinstance(value, dict) and value else [path]
    return paths


def _documented_values(readme: str) -> set[str]:
    """Keys in the first column of the chart README's values table; `.x` after `a.b` means `a.x`."""
    section = readme.split("## Values", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for key in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if key.startswith("."):
                key = parent + key
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            documented.add(key)
    return documented


def test_the_chart_readme_documents_every_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = _documented_values((CHART / "README.md").read_text())
    missing = [path for path in _value_paths(values)
               if not any(path == d or path.startswith(d + ".") for d in documented)]
    assert not missing, f"charts/scalingrun/README.md's values table lacks: {missing}"
    unknown = [d for d in documented if not any(p == d or p.startswith(d + ".") for p in _value_paths(values))]
    assert not unknown, f"charts/scalingrun/README.md documents values that values.yaml lacks: {unknown}"


def test_the_chart_readme_names_the_verbs_rbac_grants_on_pods_and_namespaces():
    """The README's RBAC section says of pods and namespaces what templates/ grant, word for word."""
    templates = (CHART / "templates" / "_helpers.tpl").read_text() + (CHART / "templates" / "rbac.yaml").read_text()
    rbac = " ".join((CHART / "README.md").read_text().split("## RBAC", 1)[1].split())
    for resource, said_as in (("pods", "Pods"), ("namespaces", "namespaces")):
        granted = re.search(r'resources: \["' + resource + r'"\]\s*\n\s*verbs: \[([^\]]*)\]', templates)
        verbs = "/".join(v.strip().strip('"') for v in granted.group(1).split(","))
        assert f" {verbs} {said_as}" in rbac, f"charts/scalingrun/README.md should say '{verbs} {said_as}'"
