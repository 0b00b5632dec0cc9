"""Reading the user's files as kubectl does (-f FILE, -f DIR, -f -, several documents, kind: List) and writing
data back (-o yaml|json). A user's mistake becomes a UserError: one line, no traceback."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from scalingrun_api.models import GROUP, KIND, SWEEP_KIND
from ..schema import strict_yaml

OURS = (KIND, SWEEP_KIND)
EXTENSIONS = (".yaml", ".yml", ".json")
# The exit codes, as kubectl and helm use them (documented in `scalingrun --help` and docs/operations.md).
OK, FAILED, USAGE = 0, 1, 2


class UserError(Exception):
    """A mistake the user can fix: printed as one line, exits with `code`."""

    def __init__(self, message: str, code: int = FAILED):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Document:
    source: str  # the file (or -) it came from
    body: Any

    @property
    def kind(self) -> str:
        return str(self.body.get("kind")) if isinstance(self.body, dict) else "?"

    @property
    def name(self) -> str:
        metadata = self.body.get("metadata") if isinstance(self.body, dict) else None
        return str((metadata or {}).get("name", "?")) if isinstance(metadata, dict) else "?"


def files(path: str) -> list[str]:
    if path == "-":
        return [path]
    target = Path(path)
    if target.is_dir():
        found = sorted(str(p) for p in target.iterdir() if p.is_file() and p.suffix in EXTENSIONS)
        if not found:
            raise UserError(f"{path}: no *.yaml, *.yml or *.json file in this folder")
        return found
    if not target.exists():
        raise UserError(f"{path}: no such file or directory")
    return [path]


def yaml_error(path: str, exc: yaml.YAMLError) -> UserError:
    """The error that says `path` is not valid YAML, with the line and column where the parser stopped."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return UserError(f"{path}: not valid YAML{where}: {problem}")


def _flatten(body: Any) -> Iterable[Any]:
    """The items of a `kind: List` (or any *List with items, as kubectl get -o yaml writes), recursively."""
    if isinstance(body, dict) and str(body.get("kind", "")).endswith("List") and isinstance(body.get("items"), list):
        for item in body["items"]:
            yield from _flatten(item)
    elif body is not None:
        yield body


def read_file(path: str) -> list[Document]:
    """Every document of one file (or - for stdin), Lists flattened; nulls (an empty `---`) dropped. A duplicate
    key is bad YAML here, as it is to kubectl."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        bodies = strict_yaml.load_all(text)
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    return [Document(path, body) for raw in bodies for body in _flatten(raw)]


def is_ours(doc: Document) -> bool:
    """A ScalingRun or ScalingSweep, or something meant as one: without a kind, or in our API group (a misspelt
    kind is then reported by validation, not skipped)."""
    body = doc.body
    if not isinstance(body, dict) or "kind" not in body or body["kind"] in OURS:
        return True
    return str(body.get("apiVersion", "")).split("/")[0] == GROUP


def skipped_note(doc: Document) -> str:
    return f"{doc.source}: skipped {doc.kind}/{doc.name}: not a {KIND} or {SWEEP_KIND}"


def read(paths: Iterable[str]) -> list[Document]:
    """Our documents from every -f (files, folders, -); others are named on stderr and skipped. Raises UserError
    when none is left."""
    paths = list(paths)
    ours = []
    for path in paths:
        for file in files(path):
            for doc in read_file(file):
                if is_ours(doc):
                    ours.append(doc)
                else:
                    print(skipped_note(doc), file=sys.stderr)
    if not ours:
        raise UserError(f"{', '.join(paths)}: no {KIND} or {SWEEP_KIND} found")
    return ours


COMMAND_OF = {KIND: "run", SWEEP_KIND: "sweep"}


def read_one(paths: Iterable[str], kinds: tuple[str, ...], command: str) -> Document:
    """The one document that run, sweep or report take; a kind the command does not take gets the command that
    does (a ScalingSweep given to run: use sweep)."""
    docs = read(paths)
    if len(docs) != 1:
        names = ", ".join(f"{d.kind}/{d.name}" for d in docs)
        raise UserError(f"scalingrun {command}: expected one {' or '.join(kinds)}, found {len(docs)}: {names}",
                        USAGE)
    doc = docs[0]
    if doc.kind in COMMAND_OF and doc.kind not in kinds:
        raise UserError(f"{doc.source}: {doc.kind}/{doc.name} is a {doc.kind}, not a {' or '.join(kinds)}: use "
                        f"`scalingrun {COMMAND_OF[doc.kind]} --local -f {doc.source}`", USAGE)
    return doc


class _NoAliases(yaml.SafeDumper):
    """No anchors (&id001) for an object that appears twice: kubectl and people read plain YAML."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(objects: list[Any], output: str) -> str:
    """-o yaml: a stream of documents (kubectl apply -f takes it); -o json: one object, or a List of several."""
    if output == "json":
        body = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(body, indent=2) + "\n"
    return yaml.dump_all(objects, Dumper=_NoAliases, sort_keys=False, width=100)
