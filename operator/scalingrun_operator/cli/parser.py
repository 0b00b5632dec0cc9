"""The argparse parser of `scalingrun`: a description and an example for every subcommand, the exit codes in
the help. The completion scripts are generated from it (completion.py)."""

from __future__ import annotations

import argparse
from importlib import metadata

from scalingrun_api.models import API_VERSION
from .cluster import cmd_get, cmd_wait
from .commands import cmd_crd, cmd_operator, cmd_render, cmd_report, cmd_run, cmd_sweep, cmd_validate
from .completion import SHELLS, cmd_completion
from .doctor import cmd_doctor
from .logs import cmd_logs

EXIT_CODES = """exit codes:
  0  done: the files are valid, the objects printed, the run succeeded
  1  failed: an invalid spec, a file that cannot be read or holds no ScalingRun, a failed run,
     a wait that ends otherwise or times out, a run not found, a log neither live nor archived,
     a store that cannot be read
  2  usage: a wrong flag or argument, a ScalingSweep given to run (or the reverse)
  129, 130, 143  run --local, sweep --local: stopped by SIGHUP, SIGINT or SIGTERM (after stopping
     every process it started); logs ended with Ctrl-C: 130"""

OUTPUTS = ("yaml", "json")


def version() -> str:
    try:
        number = metadata.version("scalingrun")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        number = "unknown"
    return f"scalingrun {number} (API {API_VERSION})"


class _Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; text with its own line breaks (examples, exit codes) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True)) if "\n" in text else \
            super()._fill_text(text, width, indent)


def _add(sub, name: str, summary: str, description: str, examples: str, func) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=summary, description=description, epilog=f"examples:\n{examples}",
                            formatter_class=_Formatter)
    parser.set_defaults(func=func)
    return parser


def _filename(parser: argparse.ArgumentParser, repeatable: bool = False, required: bool = True) -> None:
    if repeatable:
        parser.add_argument("-f", "--filename", action="append", required=required, metavar="FILE",
                            help="a file, a folder (its *.yaml, *.yml and *.json) or - for stdin; repeatable")
    else:
        parser.add_argument("-f", "--filename", required=required, metavar="FILE", help="a file or - for stdin")


def _python_path(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--python-path", action="append", metavar="DIR",
                        help=f"a folder with your packages (model.builder, training.command), first on {what}'s "
                             "PYTHONPATH as in your image (repeatable)")


def _cluster_flags(parser: argparse.ArgumentParser, kinds: bool = True) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
    if kinds:
        parser.add_argument("--kind", choices=("ScalingRun", "ScalingSweep"), help="only this kind (default: both; "
                            "a name is looked up as a run first)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")


def build_parser(prog: str = "scalingrun") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=_Formatter, epilog=EXIT_CODES,
        description="Check, render and run ScalingRuns and ScalingSweeps, and follow them in a cluster; crd, validate, "
                    "render, run and sweep need no cluster.")
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = _add(sub, "crd", "print the ScalingRun and ScalingSweep CustomResourceDefinitions",
               "Print both CustomResourceDefinitions (the chart installs the same ones).",
               "  scalingrun crd | kubectl apply --server-side -f -", cmd_crd)
    crd.add_argument("-o", "--output", choices=OUTPUTS, default="yaml", help="output format (default yaml)")

    validate = _add(sub, "validate", "check ScalingRun and ScalingSweep files; name every bad field",
                    "Check every ScalingRun and ScalingSweep as the API server and the operator will, naming every "
                    "bad field. Other kinds in the same files are skipped and named.",
                    "  scalingrun validate -f my-run.yaml\n  scalingrun validate -f examples/",
                    cmd_validate)
    _filename(validate, repeatable=True)
    validate.add_argument("--allow-host-path", action="store_true",
                          help="accept hostPath volumes in spec.podOverrides, as an operator with the chart's "
                          "runs.allowHostPath does")

    render = _add(sub, "render", "print every Kubernetes object the operator would create",
                  "Print the objects the operator would create: a run's ConfigMap, preprocessing Job and MPIJob; a "
                  "sweep's ScalingRuns.",
                  "  scalingrun render -f examples/quickstart.yaml -n team-a\n"
                  "  scalingrun render -f examples/sweep.yaml -o json", cmd_render)
    _filename(render, repeatable=True)
    render.add_argument("-n", "--namespace", help="namespace (default: the object's, else default)")
    render.add_argument("-o", "--output", choices=OUTPUTS, default="yaml", help="output format (default yaml)")

    run = _add(sub, "run", "run a ScalingRun on this machine (--local), without Kubernetes",
               "Run one ScalingRun here: preprocess the dataset, then train with the engine's launcher (horovodrun or "
               "mpirun), as the operator would in a cluster. In a cluster, kubectl apply -f the file instead.",
               "  scalingrun run --local -f examples/quickstart.yaml\n"
               "  scalingrun run --local -f my-run.yaml --np 2 --python-path src/", cmd_run)
    run.add_argument("--local", action="store_true", help="preprocess, then train here (required)")
    _filename(run)
    run.add_argument("--np", type=int, help="processes (default: workers.replicas x slots)")
    run.add_argument("--workdir", metavar="DIR", help="where config and status go (default .scalingrun/runs/NAME)")
    run.add_argument("--stop-after", choices=["preprocessing", "training"], default="training",
                     help="stop after this step (default training)")
    _python_path(run, "the processes")

    sweep = _add(sub, "sweep", "run a ScalingSweep's points on this machine (--local), one after another",
                 "Run a ScalingSweep's points here one after another (each with N processes), then print the scaling "
                 "table and draw the report.",
                 "  scalingrun sweep --local -f examples/sweep.yaml -o reports/", cmd_sweep)
    sweep.add_argument("--local", action="store_true", help="each point with its N training processes here (required)")
    _filename(sweep)
    sweep.add_argument("--workdir", metavar="DIR",
                       help="where the points' config and status go (default .scalingrun/sweeps/NAME)")
    sweep.add_argument("-o", "--output", metavar="DIR", help="folder for the report (default: the workdir)")
    _python_path(sweep, "the points")

    report = _add(sub, "report", "draw a run's curves or a sweep's scaling (PNG + Markdown) from progress documents",
                  "Draw a run's training curves and epoch table, or a sweep's scaling, from the progress documents "
                  "in the run's location (S3 keys from the environment, as for any S3 client); when that store "
                  "cannot be read, from the copy a local run kept (the quick start's store stops with it).",
                  "  scalingrun report -f examples/quickstart.yaml -o reports/\n"
                  "  scalingrun report --progress s3://bucket/runs/demo/progress.json --name demo",
                  cmd_report)
    _filename(report, required=False)
    report.add_argument("--progress", help="or a progress.json path or URI")
    report.add_argument("--name", default="run", help="run name for the titles (with --progress)")
    report.add_argument("--workdir", metavar="DIR", help="with -f: the local run's workdir, whose kept progress.json is drawn when "
                        "the store cannot be read (default: .scalingrun/quickstart/runs/NAME, then "
                        ".scalingrun/runs/NAME)")
    report.add_argument("-o", "--output", metavar="DIR", default=".", help="folder for the report files")

    get = _add(sub, "get", "show runs and sweeps from the cluster: phase, epoch, img/s, input wait, best val_accuracy",
               "Show ScalingRuns and ScalingSweeps from the cluster (the kubeconfig's current context and namespace): "
               "phase, workers, epoch, images/s, input wait, the best epoch's val_accuracy, ETA, restarts and message; "
               "-w prints a row at every change.",
               "  scalingrun get\n  scalingrun get quickstart -w\n  scalingrun get flowers-sweep -o yaml",
               cmd_get)
    get.add_argument("name", nargs="?", help="a run's or a sweep's name (default: all of them)")
    get.add_argument("-w", "--watch", action="store_true", help="after the table, a row at every change")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    get.add_argument("-o", "--output", choices=(*OUTPUTS, "wide"), help="json or yaml: the objects; wide: whole "
                     "messages")
    _cluster_flags(get)

    wait = _add(sub, "wait", "wait until a run or sweep reaches a phase or condition",
                "Wait until a run (or sweep) reaches a phase (--for Succeeded) or a condition (--for condition=Ready, "
                "or condition=Ready=False). Exits 0 when it does, 1 when it ends otherwise (Failed when Succeeded "
                "was wanted) or the timeout passes.",
                "  scalingrun wait quickstart --for Succeeded --timeout 30m\n"
                "  scalingrun wait flowers-sweep --for Succeeded", cmd_wait)
    wait.add_argument("name", help="the run's (or sweep's) name")
    wait.add_argument("--for", dest="wanted", default="Succeeded", metavar="PHASE|condition=TYPE[=STATUS]",
                      help="a phase (default Succeeded) or condition=TYPE[=STATUS]")
    wait.add_argument("--timeout", help="seconds or a duration such as 90s, 10m or 1h30m (default: no limit)")
    _cluster_flags(wait)

    doctor = _add(sub, "doctor", "check the cluster: MPIJob API and controller, Kueue, CRD version, the operator, "
                  "GPUs", "Check what the kube context's cluster has for ScalingRuns to train, one line each: the "
                  "MPIJob API served (kubeflow.org/v2beta1, not the Training Operator v1's v1), the controller serving "
                  "it and a Training Operator v1 competing for it, Kueue, the CRDs' version against this scalingrun's, "
                  "and the operator (ready, its /healthz through the API server). For the namespace's active runs: "
                  "the GPU resource they ask for, allocatable per node; the NVIDIA driver of the GPU nodes (GPU "
                  "feature discovery's labels) against R580; Kueue's MPIJob and Job integrations and a LocalQueue for "
                  "each queue they name. Exits 1 when a check fails.",
                  "  scalingrun doctor\n  scalingrun doctor --context prod -n team-a", cmd_doctor)
    _cluster_flags(doctor, kinds=False)

    logs = _add(sub, "logs", "print a run's training log: from its launcher pod, or archived once the pods are gone",
                "Print the launcher's log (mpirun's output: every rank's lines, each tagged [1,RANK]), one rank's lines "
                "(--rank), or the preprocessing pods' logs (--preprocess). While the pod exists its log is read "
                "through the API server (-f follows it); once it is gone, the log it archived when it ended is read "
                "from the run's storage (status.logs) with the keys of the run's credentials Secret, or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY when you may not read it. The archive keeps each "
                "attempt's last 1 MiB and each rank's last 200 lines.",
                "  scalingrun logs quickstart -f\n"
                "  scalingrun logs quickstart --rank 1\n"
                "  scalingrun logs quickstart --attempt 1 --endpoint http://localhost:8333\n"
                "  kubectl scalingrun logs quickstart --preprocess", cmd_logs)
    logs.add_argument("name", help="the run's name")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--launcher", action="store_true", help="the launcher's log, every rank's lines (default)")
    which.add_argument("--rank", type=int, metavar="N", help="only rank N's lines, without their tag")
    which.add_argument("--preprocess", action="store_true", help="the preprocessing pods' logs")
    logs.add_argument("-f", "--follow", action="store_true", help="follow the live pod's log")
    logs.add_argument("--attempt", type=int, metavar="N", help="the archived log of attempt N (1 is the first "
                      "launcher; default: the live pod, else the last attempt)")
    logs.add_argument("--endpoint", metavar="URL", help="the store's endpoint as reachable from here (default: the "
                      "run's spec.storage.endpoint)")
    _cluster_flags(logs, kinds=False)

    completion = _add(sub, "completion", "print a shell completion script (bash, zsh or fish)",
                      "Print a completion script for your shell.",
                      "  source <(scalingrun completion bash)            # bash, in ~/.bashrc\n"
                      "  scalingrun completion zsh > \"${fpath[1]}/_scalingrun\"  # zsh\n"
                      "  scalingrun completion fish > ~/.config/fish/completions/scalingrun.fish",
                      cmd_completion)
    completion.add_argument("shell", choices=tuple(SHELLS))
    completion.set_defaults(root=parser)

    operator = _add(sub, "operator", "run the Kubernetes operator (same as scalingrun-operator)",
                    "Run the operator; its flags are scalingrun-operator's (scalingrun operator --help).",
                    "  scalingrun operator --all-namespaces", cmd_operator)
    operator.add_argument("operator_args", nargs=argparse.REMAINDER, help="scalingrun-operator flags")
    return parser
