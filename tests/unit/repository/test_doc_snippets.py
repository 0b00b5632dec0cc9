"""Every YAML snippet in README.md and docs/*.md that is a ScalingRun or ScalingSweep, or a part of a ScalingRun's
spec, validates as written (issue 31, item 6), read by PyYAML as kubectl's parser reads it (YAML 1.1: an unquoted
off is false; a duplicate key refused). A part is put into the smallest valid run first. A snippet that is something else (Helm values)
says so in an HTML comment on the line before its fence: <!-- snippet: not a ScalingRun -->."""

from __future__ import annotations

import copy
import re
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from scalingrun_api.models import KIND, SWEEP_KIND, ScalingRunSpec
from scalingrun_operator.schema import strict_yaml
from scalingrun_operator.schema.validation import parse_scalingrun, parse_scalingsweep
from tests.support.specs import MINIMAL

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)
NOT_OURS = "<!-- snippet: not a ScalingRun -->"
SPEC_FIELDS = {field.alias or name for name, field in ScalingRunSpec.model_fields.items()}


def snippets() -> Iterator[tuple[str, str, bool]]:
    """(page:line, text, marked as not ours) of every ```yaml block."""
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            yield f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(1)), before.strip() == NOT_OURS


def merged(base: Any, part: Any) -> Any:
    if isinstance(base, dict) and isinstance(part, dict):
        return {**base, **{key: merged(base.get(key), value) for key, value in part.items()}}
    return part


def check(document: Any) -> None:
    if isinstance(document, dict) and document.get("kind") in (KIND, SWEEP_KIND):
        (parse_scalingsweep if document["kind"] == SWEEP_KIND else parse_scalingrun)(document)
        return
    assert isinstance(document, dict), "not a mapping: mark it not a ScalingRun, or make it one"
    part = document if set(document) == {"spec"} else {"spec": document}
    unknown = set(part["spec"]) - SPEC_FIELDS if isinstance(part["spec"], dict) else {"spec"}
    assert not unknown, f"{sorted(unknown)} are no ScalingRun spec fields: mark it `{NOT_OURS}` if it is no run"
    parse_scalingrun(merged(copy.deepcopy(MINIMAL), part))


ALL = list(snippets())


@pytest.mark.parametrize("where, text, not_ours", ALL, ids=[s[0] for s in ALL])
def test_every_yaml_snippet_validates_as_written(where, text, not_ours):
    if not_ours:
        assert "apiVersion: scalingrun.dev" not in text, f"{where} is marked not a ScalingRun but is one"
        return
    for document in strict_yaml.load_all(text):
        if document is not None:
            check(document)


def test_the_snippets_are_found():
    places = [where for where, _, _ in ALL]
    assert any(p.startswith("README.md") for p in places) and any("feature-cache.md" in p for p in places)
    # Helm values: docs/security.md's NetworkPolicy, docs/run-in-a-cluster.md's pinned digests.
    assert sum(not_ours for _, _, not_ours in ALL) == 2


def test_an_unquoted_off_in_a_snippet_is_valid():
    check(yaml.safe_load("spec:\n  training:\n    featureCache: off\n"))


def test_a_bad_snippet_fails():
    from scalingrun_operator.schema.validation import InvalidScalingRun

    with pytest.raises(InvalidScalingRun, match="spec.workers.cpu"):
        check(yaml.safe_load("workers:\n  cpu: 0\n"))
    with pytest.raises(AssertionError, match="networkPolicy"):
        check(yaml.safe_load("networkPolicy:\n  enabled: true\n"))
