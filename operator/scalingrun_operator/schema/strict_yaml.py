"""YAML read as kubectl and the API server read it: a key twice in one mapping is refused, naming the key and its
lines (PyYAML keeps the last one, so a spec would validate here what the server refuses)."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a duplicate key. Keys merged in with `<<:` may be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so below
                continue
            if seen is not None:
                raise ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (first on line {seen}): kubectl and the "
                    "API server refuse a duplicate key; keep one", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_all(text: str) -> list[Any]:
    """Every document of TEXT; yaml.YAMLError (with its line) for bad YAML or a duplicate key."""
    return list(yaml.load_all(text, Loader=_StrictLoader))


def load(text: str) -> Any:
    """The one document of TEXT, as load_all reads it."""
    return yaml.load(text, Loader=_StrictLoader)
