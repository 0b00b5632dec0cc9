"""A spec's errors in the user's words: one FieldError per bad field, patterns said in words, and an unknown field
with the name meant (the camelCase one for a snake_case spelling, the nearest for a typo)."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Iterable, Iterator

import pydantic
from pydantic.alias_generators import to_camel

from scalingrun_api.models import (
    BUILDER_PATTERN, DATA_URI_PATTERN, DNS_SUBDOMAIN_PATTERN, HTTP_URL_PATTERN, IMAGE_REFERENCE_PATTERN,
    LABEL_VALUE_PATTERN, QUANTITY_PATTERN, WEIGHTS_PATTERN,
)
from scalingrun_api.models.common import DURATION_PATTERN, QUANTITY_NUMBER

from .findings import FieldError, InvalidScalingRun  # noqa: F401 (InvalidScalingRun: its callers' import)


def field_path(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
}

# Errors where a word was due: a boolean there is most often YAML 1.1's reading of an unquoted word.
_WORD_EXPECTED = ("string_type", "enum", "literal_error", "string_pattern_mismatch")

# A pattern said in words: a user reads "a positive quantity such as 500m", not the regular expression.
_PATTERN_WORDS = {
    QUANTITY_PATTERN: "must be a positive quantity such as 500m, 2 or 16Gi",
    DURATION_PATTERN: "must be seconds or a duration such as 90s, 10m or 1h30m",
    DATA_URI_PATTERN: "must be an s3://bucket/path, file:///path or /absolute/path URI",
    WEIGHTS_PATTERN: "must be imagenet, none, or an s3://, file:/// or /absolute path to a weights file",
    DNS_SUBDOMAIN_PATTERN: "must be a Kubernetes name: lower-case letters, digits, '-' and '.', starting and ending "
                           "with a letter or digit",
    LABEL_VALUE_PATTERN: "must be a label value: letters, digits, '-', '_' and '.', starting and ending with a "
                         "letter or digit",
    HTTP_URL_PATTERN: "must be an http:// or https:// URL",
    BUILDER_PATTERN: "must be module.path:function, e.g. my_models.heads:build",
    IMAGE_REFERENCE_PATTERN: "must be an image reference [registry/]path[:tag][@sha256:<64 hex digits>], e.g. "
    "registry.example.com/ml/trainer:0.1.0-cpu or registry.example.com/ml/trainer@sha256:<digest>",
}


def pydantic_errors(exc: pydantic.ValidationError) -> list[FieldError]:
    errors = []
    for err in exc.errors(include_url=False):
        message = _MESSAGES.get(err["type"], err["msg"])
        if err["type"] == "string_pattern_mismatch":
            message = _PATTERN_WORDS.get((err.get("ctx") or {}).get("pattern"), message)
        if err["type"] not in ("missing", QUANTITY_NUMBER):  # the quantity's message names the number itself
            message += f" (got {err['input']!r})" if not isinstance(err["input"], dict) else ""
        if isinstance(err.get("input"), bool) and err["type"] in _WORD_EXPECTED:
            message += (": YAML reads an unquoted yes, no, on, off, true or false as a boolean; quote the word, "
                        "e.g. \"on\"")
        errors.append(FieldError(field_path(err["loc"]), message))
    return errors


# --- unknown fields --------------------------------------------------------------------------------------------


def unknown_field_message(key: str, names: list[str]) -> str:
    """What to say of KEY where the fields are NAMES (as written in a spec): the name meant, when one is near."""
    camel = to_camel(key.replace("-", "_"))
    if camel != key and camel in names:
        return f"unknown field: write {camel} (fields are camelCase; the API server refuses or drops {key})"
    by_lower = {name.lower(): name for name in names}
    if key.lower() in by_lower:
        return f"unknown field: write {by_lower[key.lower()]} (field names are case-sensitive)"
    near = difflib.get_close_matches(key.lower(), list(by_lower), n=1)
    return f"unknown field; did you mean {by_lower[near[0]]}?" if near else "unknown field"


def unknown_fields(node: Any, model: type[pydantic.BaseModel], path: str = "") -> Iterator[FieldError]:
    """Every key in NODE, recursively, that is no field's name on the wire (its alias) in MODEL, with the name meant.
    pydantic takes a field's Python name too (gpus_per_worker), which the API server does not; models that keep
    unknown keys (metadata) are not looked into."""
    if not isinstance(node, dict) or model.model_config.get("extra") != "forbid":
        return
    fields = {info.alias or name: info.annotation for name, info in model.model_fields.items()}
    for key, value in node.items():
        here = f"{path}.{key}" if path else str(key)
        if key in fields:
            yield from _unknown_inside(value, fields[key], here)
        else:
            yield FieldError(here, unknown_field_message(str(key), list(fields)))


def _unknown_inside(value: Any, annotation: Any, path: str) -> Iterator[FieldError]:
    """unknown_fields of VALUE, typed ANNOTATION: a model, an optional one, a list or a dict of them."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        yield from unknown_fields(value, annotation, path)
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _unknown_inside(value, arg, path)
    elif origin is typing.Annotated:
        yield from _unknown_inside(value, args[0], path)
    elif origin is list and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unknown_inside(item, args[0], f"{path}[{index}]")
    elif origin is dict and isinstance(value, dict):
        for key, item in value.items():
            yield from _unknown_inside(item, args[1], f"{path}.{key}")


def schema_errors(document: dict[str, Any], resource: type[pydantic.BaseModel],
                  exc: pydantic.ValidationError | None) -> list[FieldError]:
    """pydantic's errors of DOCUMENT, each unknown field said with the name meant, and the unknown fields pydantic
    took by their Python names."""
    unknown = {error.path: error for error in unknown_fields(document, resource)}
    errors = [unknown.pop(error.path, error) for error in (pydantic_errors(exc) if exc else [])]
    return errors + list(unknown.values())
