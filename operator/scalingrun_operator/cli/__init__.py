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
    except BrokenPipeError:  # `scalingrun render ... | head`: the reader left, as for kubectl
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
