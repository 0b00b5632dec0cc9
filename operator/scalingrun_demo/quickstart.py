"""The quick start in a cluster (`scripts/quickstart.sh --cluster`): into the current kube context it builds the
images and makes them available to the nodes, checks that something serves MPIJobs, installs the chart (unless an
operator is there), runs SeaweedFS as the demo's object store, uploads Fashion-MNIST JPEGs, applies a 2-worker
CPU ScalingRun (examples/quickstart.yaml), follows it on one line and prints its summary and report.
`--down` (teardown.py) removes what it added that holds no user data (never a CRD: with it would go every ScalingRun and
ScalingSweep in the cluster) and names what it leaves and why; the demo namespace records what it added.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from . import seaweedfs
from .delivery import (ROOT, Kube, QuickstartError, build_images, build_seaweedfs, cluster_nodes, deliver, image_names,
                       image_route, loader, say, split_image)
from .footprint import (ADDED, LABELS, NAMESPACE, OPERATOR_CRDS, OWNED, RELEASE, RUN_NAME, SECRET, SYSTEM_NAMESPACE,
                        demo_namespace)
from .teardown import down

TERMINAL = ("Succeeded", "Failed")
WORKER_CPUS = ("1", "500m", "250m")  # tried in this order when --worker-cpu is not given


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/quickstart.sh --cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--down", action="store_true", help="remove what the quick start added to the cluster")
    parser.add_argument("--context", help="kube context (default: the current one)")
    parser.add_argument("-n", "--namespace", default=NAMESPACE, help=f"the demo's namespace (default {NAMESPACE})")
    parser.add_argument("--no-build", action="store_true", help="use the images already in Docker")
    parser.add_argument("--registry", default="", metavar="REGISTRY/PREFIX",
                        help="push the images there (a cluster that cannot use this machine's Docker)")
    parser.add_argument("--per-class", type=int, default=1000, help="Fashion-MNIST images per class (default 1000)")
    parser.add_argument("--max-epochs", type=int, help="override spec.training.maxEpochs (default: the example's)")
    parser.add_argument("--worker-cpu", help="CPU per worker and per preprocessing pod (default: the first of "
                        f"{', '.join(WORKER_CPUS)} that fits the nodes' free CPU, the arithmetic shown)")
    parser.add_argument("--worker-memory", default="4Gi", help="memory per worker (default 4Gi)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to follow the run (default 3600)")
    parser.add_argument("--skip-capacity-check", action="store_true",
                        help="do not compare the requests with the nodes' free CPU and memory (a cluster that adds "
                        "nodes on demand)")
    parser.add_argument("--skip-mpi-check", action="store_true",
                        help="do not look for an MPIJob controller (one this check does not recognise)")
    parser.add_argument("--reports", default=".scalingrun/quickstart-cluster/reports", help="where the report goes")
    return parser.parse_args(argv)


# --- what is there ---------------------------------------------------------------------------------------------


def mpijob_controllers(kube: Kube) -> list[str]:
    """Ready Deployments that serve v2beta1 MPIJobs (mpi-operator, or a stand-in named so), as `scalingrun doctor`
    tells them (cluster/preflight.py)."""
    from scalingrun_operator.cluster.preflight import classify  # here, as yaml below: --help runs on a bare Python
    found = [classify(d) for d in (kube.get("deployments", "--all-namespaces") or {}).get("items", [])]
    return [c.where for c in found if c is not None and c.kind == "mpi-operator" and c.ready]


def check_mpi_operator(kube: Kube, skip: bool) -> None:
    from scalingrun_api.models import MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION  # --help runs without pydantic
    from scalingrun_operator.builders.mpijob import MPI_OPERATOR_INSTALL
    from scalingrun_operator.cluster.preflight import other_mpijob_versions
    mpijob_crd = f"{MPIJOB_PLURAL}.{MPIJOB_GROUP}"
    crd = kube.get("crd", mpijob_crd)
    if crd is None:
        raise QuickstartError(f"the cluster has no MPIJob CRD ({mpijob_crd}): ScalingRuns train through Kubeflow's "
                              f"mpi-operator v0.8. Install it, then run this again:\n  {MPI_OPERATOR_INSTALL}")
    served = [v["name"] for v in crd["spec"].get("versions") or [] if v.get("served")]
    if MPIJOB_VERSION not in served:
        raise QuickstartError(other_mpijob_versions(served))
    if skip:
        say("MPIJob CRD found; not looking for its controller (--skip-mpi-check)")
        return
    controllers = mpijob_controllers(kube)
    if not controllers:
        raise QuickstartError("the MPIJob CRD is there, but no ready Deployment serves MPIJobs (none named like "
                              f"mpi-operator): the run would wait forever. Install it:\n  {MPI_OPERATOR_INSTALL}\n"
                              "or, if yours has another name, run this again with --skip-mpi-check")
    say(f"MPIJobs served by {', '.join(controllers)}")


def operator_there(kube: Kube) -> str:
    """What says an operator is installed already (then the quick start uses it), or "" when there is none."""
    if kube.helm("status", RELEASE, "-n", SYSTEM_NAMESPACE, check=False).returncode == 0:
        return f"using the operator already installed (helm release {RELEASE} in {SYSTEM_NAMESPACE})"
    crd = kube.get("crd", OPERATOR_CRDS[0])
    if crd is not None and not kept_by_release(crd):
        return f"{OPERATOR_CRDS[0]} is there (an operator installed without this release): using it"
    return ""


def worker_cpu(kube: Kube, args: argparse.Namespace, installs_chart: bool) -> str:
    """--worker-cpu, or the first of WORKER_CPUS whose requests fit the nodes' free capacity; QuickstartError with
    the arithmetic when none does (checked before anything is built or installed)."""
    from scalingrun_operator.builders import build_children
    from scalingrun_operator.schema.validation import parse_scalingrun
    from . import quickstart_sizing as sizing

    tried = [args.worker_cpu] if args.worker_cpu else list(WORKER_CPUS)
    if args.skip_capacity_check:
        return tried[0]
    resident = sizing.demands([o for o in yaml_documents(kube.helm("template", RELEASE, "charts/scalingrun", "-n",
                                                                   SYSTEM_NAMESPACE).stdout)], "operator") \
        if installs_chart else []
    if kube.get("deployment", seaweedfs.SERVICE, "-n", args.namespace) is None:
        resident += sizing.demands(seaweedfs.demo_manifests(args.namespace, seaweedfs.IMAGE, SECRET, "", "", LABELS),
                                   "SeaweedFS")
    candidates = [(cpu, resident + sizing.demands(build_children(parse_scalingrun(run_document(
        args.namespace, None, args.max_epochs, cpu, args.worker_memory)), namespace=args.namespace)))
        for cpu in tried]
    nodes, pods = kube.get("nodes"), kube.get("pods", "--all-namespaces")
    try:
        chosen, lines = sizing.choose(candidates, sizing.capacity(nodes["items"], pods["items"]))
    except ValueError as exc:
        raise QuickstartError(f"the quick start does not fit the free CPU and memory of context {kube.context}; "
                              f"nothing was installed:\n  {str(exc).replace(chr(10), chr(10) + '  ')}\n"
                              "free some, add a node, or pass --skip-capacity-check when the cluster adds nodes on "
                              "demand") from None
    for line in lines:
        say(line)
    return chosen


def yaml_documents(text: str) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(text) if d]


# --- up --------------------------------------------------------------------------------------------------------


def install_operator(kube: Kube, operator_image: str, trainer_image: str) -> dict[str, Any]:
    """The chart, unless a release or the CRDs say an operator is there; what it added."""
    there = operator_there(kube)
    if there:
        say(there)
        return {}
    system_namespace_existed = kube.get("namespace", SYSTEM_NAMESPACE) is not None
    repository, tag = split_image(operator_image)
    trainer_repository, trainer_tag = split_image(trainer_image.rsplit("-cpu", 1)[0])
    say(f"installing the chart: helm install {RELEASE} charts/scalingrun -n {SYSTEM_NAMESPACE}")
    started = time.monotonic()
    kube.helm("install", RELEASE, "charts/scalingrun", "-n", SYSTEM_NAMESPACE, "--create-namespace",
              "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
              "--set", f"trainerImages.repository={trainer_repository}", "--set", f"trainerImages.tag={trainer_tag}",
              "--wait", "--timeout", "5m")
    say(f"operator ready in {time.monotonic() - started:.0f} s")
    return {"release": RELEASE, "releaseNamespace": SYSTEM_NAMESPACE, "crds": list(OPERATOR_CRDS),
            "createdNamespace": not system_namespace_existed}


def kept_by_release(crd: dict[str, Any]) -> bool:
    """A CRD the release left when it was uninstalled (`--down` keeps them): `helm install` of the same release
    takes it back, so it is no sign of another operator."""
    annotations = crd["metadata"].get("annotations") or {}
    return (annotations.get("meta.helm.sh/release-name"), annotations.get("meta.helm.sh/release-namespace")) == \
        (RELEASE, SYSTEM_NAMESPACE)


def s3_keys(kube: Kube, namespace: str) -> tuple[str, str]:
    """The Secret's keys when it exists (the store holds data written with them), else new ones."""
    found = kube.get("secret", SECRET, "-n", namespace)
    if found:
        data = found["data"]
        return (base64.b64decode(data["AWS_ACCESS_KEY_ID"]).decode(),
                base64.b64decode(data["AWS_SECRET_ACCESS_KEY"]).decode())
    return "quickstart-" + secrets.token_hex(4), secrets.token_hex(20)


def run_document(namespace: str, trainer_image: Optional[str], max_epochs: Optional[int], cpu: str,
                 memory: str) -> dict[str, Any]:
    """examples/quickstart.yaml pointed at the demo store (and at pushed images, when there are)."""
    import yaml  # here, so that --help runs on a bare Python

    document = yaml.safe_load((ROOT / "examples/quickstart.yaml").read_text())
    document["metadata"] = {"name": RUN_NAME, "namespace": namespace}
    document["spec"]["storage"] = {"endpoint": seaweedfs.endpoint(namespace), "credentialsSecret": SECRET}
    document["spec"]["workers"].update(cpu=cpu, memory=memory)
    document["spec"]["dataset"]["preprocessing"]["resources"] = {"cpu": cpu, "memory": "2Gi"}
    if trainer_image:
        document["spec"]["workers"]["image"] = trainer_image
    if max_epochs:
        document["spec"]["training"]["maxEpochs"] = max_epochs
    return document


def follow(kube: Kube, namespace: str, timeout: float) -> dict[str, Any]:
    """The run on one line, rewritten at every change, until it ends (or TIMEOUT); the last read of it."""
    from scalingrun_operator.cli.cluster import RUN_COLUMNS, run_row

    width = shutil.get_terminal_size((120, 20)).columns - 1
    deadline, last, run = time.monotonic() + timeout, "", {}
    tty = sys.stdout.isatty()
    while time.monotonic() < deadline:
        run = kube.get("scalingrun", RUN_NAME, "-n", namespace) or {}
        cells = run_row(run, dt.datetime.now(dt.timezone.utc)) if run else [RUN_NAME, "-"]
        line = "  ".join(f"{column.lower()} {cell}" for column, cell in zip(RUN_COLUMNS[1:], cells[1:])
                         if cell not in ("-", ""))[:width]
        if line != last:
            print(f"\r{line.ljust(len(last))}" if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if (run.get("status") or {}).get("phase") in TERMINAL:
            break
        time.sleep(2)
    if tty:
        print()
    return run


def summary(kube: Kube, namespace: str, run: dict[str, Any], keys: tuple[str, str], reports: Path) -> None:
    from scalingrun_operator.builders.locations import progress_uri
    from scalingrun_operator.documents import parse_progress
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.cli.cluster import RUN_COLUMNS, run_row, table
    from scalingrun_operator.report.run import render_report

    status = run.get("status") or {}
    print("\n== cluster quick start summary ==")
    print(table([run_row(run, dt.datetime.now(dt.timezone.utc), wide=True)], RUN_COLUMNS), end="")
    for condition in status.get("conditions") or []:
        print(f"  {condition.get('type')}={condition.get('status')} {condition.get('reason')}: "
              f"{condition.get('message')}")
    uri = progress_uri(parse_scalingrun({k: run[k] for k in ("apiVersion", "kind", "metadata", "spec")}))
    with seaweedfs.s3_filesystem(kube_command(kube), namespace, *keys) as s3:
        try:
            progress = parse_progress(json.loads(s3.open_input_stream(uri[len("s3://"):]).read()))
        except OSError as exc:
            print(f"report: no progress document at {uri} ({exc})")
            return
    png, md = render_report(progress, RUN_NAME, reports)
    print(f"model: {progress.model_uri or '-'}")
    print(f"report: {png} and {md}")


def kube_command(kube: Kube) -> list[str]:
    return ["kubectl", "--context", kube.context]


def up(args: argparse.Namespace, kube: Kube) -> int:
    started = time.monotonic()
    namespace = args.namespace
    existing = demo_namespace(kube, namespace)
    say(f"kube context {kube.context}, demo namespace {namespace}")
    check_mpi_operator(kube, args.skip_mpi_check)  # before minutes of building
    nodes = [] if args.registry or loader(kube.context) else cluster_nodes(kube)
    route = image_route(kube.context, args.registry, nodes)  # before building or installing anything
    cpu = worker_cpu(kube, args, installs_chart=not operator_there(kube))
    names = image_names() if args.no_build else build_images()
    build_seaweedfs(names.get("base", ""))
    references = deliver(kube, [names["operator"], names["trainer"], seaweedfs.IMAGE], route, args.registry)
    added = json.loads(((existing or {}).get("metadata", {}).get("annotations") or {}).get(ADDED) or "{}")
    if existing is None:
        kube.apply([{"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": namespace, "labels": {OWNED: "true"}, "annotations": {ADDED: "{}"}}}])
    if not added:
        added = install_operator(kube, references[names["operator"]], references[names["trainer"]])
        kube.kubectl("annotate", "namespace", namespace, "--overwrite", f"{ADDED}={json.dumps(added)}")
    keys = s3_keys(kube, namespace)
    kube.apply(seaweedfs.demo_manifests(namespace, references[seaweedfs.IMAGE], SECRET, *keys, LABELS))
    kube.kubectl("rollout", "status", f"deployment/{seaweedfs.SERVICE}", "-n", namespace, "--timeout=300s")
    say(f"SeaweedFS (the demo's object store: one pod, data on an emptyDir, not for real data) at "
        f"{seaweedfs.endpoint(namespace)}")
    document = run_document(namespace, references[names["trainer"]] if args.registry else None, args.max_epochs,
                            cpu, args.worker_memory)
    with seaweedfs.s3_filesystem(kube_command(kube), namespace, *keys) as s3:
        source = document["spec"]["dataset"]["source"]
        uploaded = seaweedfs.upload_jpegs(s3, source, args.per_class, None, split="train")
    say(f"dataset: {uploaded or 'already'} Fashion-MNIST JPEGs in {source}")
    if kube.get("scalingrun", RUN_NAME, "-n", namespace) is not None:  # a fresh run each time
        kube.kubectl("delete", "scalingrun", RUN_NAME, "-n", namespace, "--wait=true", "--timeout=300s")
    kube.apply([document])
    say(f"ScalingRun {namespace}/{RUN_NAME} applied: 2 workers on CPU (follow it too: scalingrun get {RUN_NAME} "
        f"-n {namespace} -w; its pods: kubectl get pods -n {namespace})")
    run = follow(kube, namespace, args.timeout)
    phase = (run.get("status") or {}).get("phase")
    summary(kube, namespace, run, keys, Path(args.reports))
    print(f"total time: {time.monotonic() - started:.0f} s")
    print(f"remove what the quick start added: scripts/quickstart.sh --cluster --down"
          f"{'' if namespace == NAMESPACE else f' --namespace {namespace}'}")
    if phase != "Succeeded":
        print(f"the run did not succeed (phase {phase or 'none'} after {args.timeout:.0f} s): "
              f"kubectl describe scalingrun {RUN_NAME} -n {namespace}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        kube = Kube(args.context)
        return down(args, kube) if args.down else up(args, kube)
    except QuickstartError as exc:
        print(f"quickstart --cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nquickstart --cluster: interrupted; what it made stays until --down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
