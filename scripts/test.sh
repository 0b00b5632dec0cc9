#!/usr/bin/env bash
# The test command: installs the pinned stack (cached), provides a real Kubernetes API server, runs pytest.
# The API server comes from KUBECONFIG, or is started by the tests from KUBEBUILDER_ASSETS; when neither is
# set and the workplace's envtest builder is beside the checkout (../shared/envtest), it is built (cached).
# Arguments go to pytest, e.g. scripts/test.sh tests/unit -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
ENVTEST_BUILDER="${SCALINGRUN_ENVTEST_BUILDER:-$ROOT/../shared/envtest/build-assets.sh}"
if [[ -z "${KUBEBUILDER_ASSETS:-}" && -z "${KUBECONFIG:-}" && -x "$ENVTEST_BUILDER" ]]; then
  KUBEBUILDER_ASSETS="$(bash "$ENVTEST_BUILDER" | tail -n1)"
  export KUBEBUILDER_ASSETS
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
