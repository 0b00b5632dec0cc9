"""A function shipped to a run's processes (`scalingrun.HorovodRunner`): how the client packs it, how every rank
checks and unpacks it, and where the ranks find it and leave rank 0's value. Both sides import this.

The function goes by value: pickled with cloudpickle where it is installed (its own module by value too, so a
function of a notebook or of a file of the caller's needs nothing installed on the ranks), else as its module's
source (or its own, for a function of __main__) and its name. The keyword arguments are pickled, and the list of
packages the ranks install before they unpack it (requirement strings, `check_packages`). A digest (sha256 of the
payload, the package list and a shipped directory with it) names it; every rank refuses a payload whose digest
differs.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

PAYLOAD_FILE = "function.pkl"
DIGEST_FILE = "function.sha256"
RESULT_FILE = "result.pkl"  # rank 0's return value, pickled
ERROR_FILE = "error.{rank}.txt"  # a rank's traceback when the function raised
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_PACKAGES = 64
MAX_PACKAGE_SPEC = 200  # characters of one requirement
FORMAT = 3  # 2: the package list; 3: a shipped directory (shipped_code). A rank reading less would run without them
_MODULE = "__scalingrun_shipped__"  # the module a function shipped as source is defined in, on the ranks
WORKER_MODULE = "scalingrun_trainer.sdk.function"  # `python -m` it on every rank: it runs the shipped function


class ShippedError(ValueError):
    """A payload that cannot be packed or used: the message says why."""


# A requirement as pip reads it, limited to a name, extras and version clauses: no URL, path, marker or option
# (the ranks pass each one to pip as a single argument, after `--`).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_CLAUSE = r"(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(rf"{_NAME}\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?\s*"
                          rf"(?:{_CLAUSE}(?:\s*,\s*{_CLAUSE})*)?")


def check_packages(packages: Any) -> list[str]:
    """The package list as given, each a requirement (`name`, `name[extra]==1.2`, `name>=1,<2`); ShippedError naming
    the first one refused and why."""
    if packages is None:
        return []
    if isinstance(packages, (str, bytes)) or not isinstance(packages, (list, tuple)):
        raise ShippedError(f"packages={packages!r}: a list of requirements, e.g. [\"pandas==2.2.3\"]")
    if len(packages) > MAX_PACKAGES:
        raise ShippedError(f"{len(packages)} packages, over the cap of {MAX_PACKAGES}")
    for spec in packages:
        check_requirement(spec)
    return list(packages)


def check_requirement(spec: Any) -> None:
    """ShippedError unless `spec` is one requirement pip may be given as an argument."""
    if not isinstance(spec, str):
        raise ShippedError(f"package {spec!r}: a requirement string, e.g. \"pandas==2.2.3\"")
    if len(spec) > MAX_PACKAGE_SPEC:
        raise ShippedError(f"package {spec[:40]!r}...: {len(spec)} characters, over the cap of {MAX_PACKAGE_SPEC}")
    if spec.lstrip().startswith("-"):
        raise ShippedError(f"package {spec!r}: an option, not a package: refused")
    if not _REQUIREMENT.fullmatch(spec):
        raise ShippedError(f"package {spec!r}: not a requirement (a name, extras and version clauses, as in "
                           "\"name[extra]>=1.0,<2\"; no URL, path or marker)")


def _installed(module: types.ModuleType) -> bool:
    """A module of an installed distribution (site-packages) or of the standard library: the ranks import it."""
    path = getattr(module, "__file__", None) or ""
    return not path or any(part in ("site-packages", "dist-packages") for part in Path(path).parts) \
        or module.__name__.split(".")[0] in sys.stdlib_module_names


def _by_source(function: Callable[..., Any]) -> dict[str, Any]:
    module = inspect.getmodule(function)
    name = function.__name__
    if "<locals>" in function.__qualname__ or name == "<lambda>":
        raise ShippedError(f"{function.__qualname__}: without cloudpickle only a module-level function can be "
                           "shipped (pip install cloudpickle to ship this one)")
    try:
        source = (inspect.getsource(module) if module is not None and module.__name__ != "__main__"
                  else textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError) as exc:
        raise ShippedError(f"{name}: its source cannot be read ({exc}): pip install cloudpickle to ship it") from None
    return {"kind": "source", "source": source, "name": name}


def pack(function: Callable[..., Any], kwargs: dict[str, Any], packages: Optional[list[str]] = None,
         code: Optional[bytes] = None) -> bytes:
    """The payload of `function(**kwargs)`, run where `packages` are installed and `code` (a directory packed by
    shipped_code.pack_directory) is first on sys.path; ShippedError when it cannot be shipped, a package is refused
    (check_packages) or it is over MAX_PAYLOAD_BYTES."""
    if not callable(function):
        raise ShippedError(f"{function!r} is not a function")
    packages = check_packages(packages)
    try:
        import cloudpickle
    except ImportError:
        shipped = _by_source(function)
        shipped["kwargs"] = pickle.dumps(kwargs)
    else:
        module = inspect.getmodule(function)
        by_value = module is not None and module.__name__ != "__main__" and not _installed(module)
        if by_value:
            cloudpickle.register_pickle_by_value(module)
        try:
            shipped = {"kind": "cloudpickle", "function": cloudpickle.dumps(function),
                       "kwargs": cloudpickle.dumps(kwargs)}
        finally:
            if by_value:
                cloudpickle.unregister_pickle_by_value(module)
    data = pickle.dumps({"format": FORMAT, "packages": packages, "code": code, **shipped})
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ShippedError(f"{getattr(function, '__name__', function)}: the function and its arguments pickle to "
                           f"{len(data):,} bytes, over the cap of {MAX_PAYLOAD_BYTES:,}: pass data by path or URI")
    return data


def worker_command(folder: str, named_digest: str, options: Sequence[str] = ()) -> list[str]:
    """A ScalingRun's training.command that runs the function stored in `folder` under `named_digest`."""
    return ["python", "-m", WORKER_MODULE, folder, "--digest", named_digest, *options]


def shipped_in(command: Optional[Sequence[str]]) -> Optional[tuple[str, str]]:
    """(folder, digest) when `command` is worker_command's, else None: the operator records them in the status."""
    if command and len(command) >= 6 and list(command[:3]) == ["python", "-m", WORKER_MODULE] \
            and command[4] == "--digest":
        return command[3], command[5]
    return None


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def open_payload(data: bytes, expected_digest: str) -> dict[str, Any]:
    """The payload's fields, its function and arguments still pickled; ShippedError when the digest differs from
    `expected_digest`, or the format or a package is not one this side reads."""
    found = digest(data)
    if found != expected_digest:
        raise ShippedError(f"the shipped function's digest is {found}, not {expected_digest}: refused")
    shipped = pickle.loads(data)  # a dict of bytes and strings: nothing of the function is loaded yet
    if shipped.get("format") != FORMAT:
        raise ShippedError(f"payload format {shipped.get('format')}, this side reads {FORMAT}")
    check_packages(shipped["packages"])
    return shipped


def load(shipped: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """(the function, its keyword arguments) of an opened payload, once its packages are importable."""
    kwargs = pickle.loads(shipped["kwargs"])
    if shipped["kind"] == "cloudpickle":
        return pickle.loads(shipped["function"]), kwargs
    module = types.ModuleType(_MODULE)
    sys.modules[_MODULE] = module  # dataclasses and pickling inside the source look their module up
    exec(compile(shipped["source"], f"<shipped {shipped['name']}>", "exec"), module.__dict__)
    return getattr(module, shipped["name"]), kwargs


def unpack(data: bytes, expected_digest: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """(the function, its keyword arguments), for a payload with no packages to install first."""
    return load(open_payload(data, expected_digest))


def write(folder: Path, data: bytes) -> str:
    """The payload and its digest in `folder`; the digest."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PAYLOAD_FILE).write_bytes(data)
    named = digest(data)
    (folder / DIGEST_FILE).write_text(named + "\n")
    return named
