#!/usr/bin/env bash
# The README's first command: the embedded default ScalingRun (examples/quickstart.yaml) on this machine.
# Installs the stack (cached), starts SeaweedFS on 127.0.0.1, uploads Fashion-MNIST JPEGs once, then
# `scalingrun run --local`. Data and status stay under .scalingrun/quickstart; rerunning reuses them.
# A first argument ending in .yaml is the ScalingRun to run (e.g. examples/quickstart-lightning.yaml); a
# pytorch-lightning one installs the Lightning venv too (only then). Other arguments go to the quick start
# (e.g. --per-class 100).
# --cluster: the quick start in the current kube context instead (scalingrun_operator.demo.quickstart: images,
# chart, a demo SeaweedFS, the data, a 2-worker CPU ScalingRun followed to its report); --cluster --down removes
# what it added but the CRDs (they hold every ScalingRun). `scripts/quickstart.sh --cluster --help` lists its options.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
if [[ "${1:-}" == --cluster ]]; then
  shift
  PATH="$PATH:$(bash scripts/tools.sh)"  # helm and kubectl, after the user's own
  export PATH TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
  exec "$ROOT/.venv/bin/python" -m scalingrun_operator.demo.quickstart "$@"
fi
if [[ "${1:-}" == *.yaml ]]; then
  if grep -Eq '^\s*framework:\s*"?pytorch-lightning' "$1"; then SCALINGRUN_PROFILE=lightning bash scripts/setup.sh; fi
  set -- -f "$@"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$ROOT/.venv/bin/python" -m scalingrun_operator.local.quickstart "$@"
