"""`scalingrun`: the user's command line (no Kubernetes access needed for crd, validate and render).

Exit codes as kubectl's and helm's: 0 done, 1 failed (an invalid spec, a file that cannot be read), 2 usage."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .loading import UserError
from .parser import build_parser

__all__ = ["build_parser", "main"]

# `pip install .` is the CLI for a cluster; what else a command needs comes with an extra (pyproject.toml).
# (The training stack of `run --local` comes from scripts/setup.sh, not from an extra.)
EXTRAS = {"matplotlib": "demo", "pyarrow": "demo", "numpy": "demo", "PIL": "demo", "kopf": "operator",
          "prometheus_client": "operator"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:  # its flags (and --help) belong to scalingrun-operator
        from .commands import cmd_operator

        return cmd_operator(argparse.Namespace(operator_args=argv[1:]))
    # Installed as kubectl-scalingrun, kubectl runs it as a plugin: `kubectl scalingrun validate -f ...`.
    plugin = Path(sys.argv[0]).name.startswith("kubectl-")
    args = build_parser("kubectl scalingrun" if plugin else "scalingrun").parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:  # the user's mistake: one line (or one per bad field), no traceback
        print(exc, file=sys.stderr)
        return exc.code
    except ModuleNotFoundError as exc:  # a package of an extra this install left out
        if (exc.name or "").split(".")[0] not in EXTRAS:
            raise
        extra = EXTRAS[exc.name.split(".")[0]]
        print(f"scalingrun {args.command}: needs {exc.name}, which `pip install .` leaves out: "
              f"pip install '.[{extra}]' (docs/install.md)", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `scalingrun render ... | head`: the reader left, as for kubectl
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
