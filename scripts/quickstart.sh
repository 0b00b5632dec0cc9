#!/usr/bin/env bash
# The README's first command: the embedded default ScalingRun (examples/quickstart.yaml) on this machine.
# Installs the stack (cached), starts SeaweedFS on 127.0.0.1, uploads Fashion-MNIST JPEGs once, then
# `scalingrun run --local`. Data and status stay under .scalingrun/quickstart; rerunning reuses them.
# A first argument ending in .yaml is the ScalingRun to run (e.g. examples/quickstart-lightning.yaml); a
# pytorch-lightning one installs the Lightning venv too (only then). Other arguments go to the quick start
# (e.g. --per-class 100).
# --cluster: the quick start in the current kube context instead (scalingrun_demo.quickstart: images,
# chart, a demo SeaweedFS, the data, a 2-worker CPU ScalingRun followed to its report); --cluster --down removes
# what it added but the CRDs (they hold every ScalingRun). `scripts/quickstart.sh --cluster --help` lists its options
# and installs nothing. --cluster needs Python 3.11 (PYTHON, default python3), Docker, and helm and kubectl (yours
# on PATH first, else scripts/tools.sh's): not the training stack. It installs the CLI with the demo's extras
# (pip install -e '.[demo]': no TensorFlow, torch or Horovod) into .venv-cluster (SCALINGRUN_CLUSTER_VENV), once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == --cluster ]]; then
  shift
  PYTHON="${PYTHON:-python3}"
  for arg in "$@"; do  # --help needs no package beyond Python's own
    if [[ "$arg" == -h || "$arg" == --help ]]; then
      PYTHONPATH="$ROOT/operator" exec "$PYTHON" -m scalingrun_demo.quickstart --help
    fi
  done
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "quickstart --cluster: needs Python 3.11 (the one the package claims and CI tests); $PYTHON is" \
      "$("$PYTHON" -V 2>&1 || echo missing). Give one: PYTHON=python3.11 scripts/quickstart.sh --cluster" >&2
    exit 1
  fi
  VENV="${SCALINGRUN_CLUSTER_VENV:-$ROOT/.venv-cluster}"
  stamp="$(sha256sum pyproject.toml | cut -d' ' -f1)"  # a changed pyproject installs again
  if [[ "$(cat "$VENV/.installed" 2>/dev/null)" != "$stamp" ]]; then
    echo "[quickstart] installing the CLI and the demo's packages into $VENV (no training stack)" >&2
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[demo]"
    echo "$stamp" > "$VENV/.installed"
  fi
  if ! command -v helm >/dev/null || ! command -v kubectl >/dev/null; then
    PATH="$PATH:$(bash scripts/tools.sh)"  # helm and kubectl (x86_64 Linux), after the user's own
  fi
  export PATH
  exec "$VENV/bin/python" -m scalingrun_demo.quickstart "$@"
fi
bash scripts/setup.sh
if [[ "${1:-}" == *.yaml ]]; then
  if grep -Eq '^\s*framework:\s*"?pytorch-lightning' "$1"; then SCALINGRUN_PROFILE=lightning bash scripts/setup.sh; fi
  set -- -f "$@"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$ROOT/.venv/bin/python" -m scalingrun_operator.local.quickstart "$@"
