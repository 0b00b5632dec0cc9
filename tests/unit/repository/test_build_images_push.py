"""`scripts/build-images.sh --registry REG --push` as docs/install.md documents it, without a registry: --dry-run
prints what --push runs (every image the build makes, under REG, then the chart as an OCI artifact at
oci://REG/charts), and wrong combinations are refused with a reason and exit code 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = "registry.example.com/ml"


def build_images(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SCALINGRUN_IMAGE_REGISTRY", "SCALINGRUN_IMAGE_TAG")}
    return subprocess.run(["bash", "scripts/build-images.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**clean, **env})


def names(*args: str, **env: str) -> dict[str, str]:
    out = build_images("--names", *args, **env)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_the_dry_run_pushes_every_image_built_under_the_registry_then_the_chart():
    out = build_images("--registry", f"{REGISTRY}/", "--push", "--dry-run")
    assert out.returncode == 0, out.stderr
    commands = [line.split() for line in out.stdout.splitlines()]
    pushed = [c[-1] for c in commands if c[1:2] == ["push"] and not c[-1].startswith("oci://")]
    built = names("--registry", REGISTRY)
    assert pushed == [built[name] for name in ("trainer", "trainer-lightning", "operator", "example-custom-model",
                                                "example-custom-model-lightning", "example-custom-training")]
    assert all(image.startswith(f"{REGISTRY}/") for image in pushed)
    chart = yaml.safe_load((ROOT / "charts/scalingrun/Chart.yaml").read_text())
    assert commands[-2] == ["helm", "package", "charts/scalingrun", "--destination", "build/charts"]
    assert commands[-1] == ["helm", "push", f"build/charts/scalingrun-{chart['version']}.tgz", f"oci://{REGISTRY}/charts"]
    # The GPU flavours push alone, without the chart.
    gpu = build_images("--gpu", f"--registry={REGISTRY}", "--push", "--dry-run")
    assert [line.split()[-1] for line in gpu.stdout.splitlines()] == [built["trainer-gpu"], built["trainer-lightning-gpu"]]


def test_the_flag_names_the_registry_over_the_variable():
    assert names("--registry", REGISTRY, SCALINGRUN_IMAGE_REGISTRY="other.example.com/x")["operator"].startswith(
        f"{REGISTRY}/operator:")
    assert names(SCALINGRUN_IMAGE_REGISTRY="other.example.com/x")["operator"].startswith("other.example.com/x/operator:")


@pytest.mark.parametrize("args, env, reason", [
    (["--dry-run"], {}, "--dry-run prints what --push runs"),
    (["--names", "--gpu"], {}, "--names and --gpu cannot be combined"),
    (["--registry"], {}, "--registry needs a registry"),
    (["--registry", "--push"], {}, "--registry needs a registry"),
    (["--names", "--push"], {}, "--names builds nothing"),
    (["--publish"], {}, "unknown argument --publish"),
    (["--push", "--dry-run"], {"SCALINGRUN_IMAGE_TAG": "9.9.9"}, "the chart's appVersion"),
])
def test_wrong_combinations_are_refused_with_a_reason(args, env, reason):
    out = build_images(*args, **env)
    assert out.returncode == 2 and reason in out.stderr, (out.returncode, out.stderr)
    assert out.stdout == ""
