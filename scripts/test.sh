#!/usr/bin/env bash
# The test command: installs the pinned stack (cached), provides a real Kubernetes API server, runs pytest,
# then the end-to-end test in a real cluster (scripts/e2e.sh).
# The tests start their own API server from KUBEBUILDER_ASSETS; when it is not set and the workplace's envtest
# builder is beside the checkout (../shared/envtest), it is built (cached). An existing cluster is used only
# when named for the tests: SCALINGRUN_TEST_KUBECONFIG=<path> (an ambient KUBECONFIG is never used).
# With arguments, only pytest runs, with them: scripts/test.sh tests/unit -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# The PyTorch Lightning venv (.venv-lightning), for tests/lightning: the whole suite, or arguments naming it.
if [[ $# -eq 0 || "$*" == *lightning* ]]; then SCALINGRUN_PROFILE=lightning bash scripts/setup.sh; fi
NODE_BUILDER="${SCALINGRUN_NODE_DIR:-$ROOT/../shared/node}/build.sh"
ENVTEST_BUILDER="${SCALINGRUN_ENVTEST_BUILDER:-$ROOT/../shared/envtest/build-assets.sh}"
unset KUBECONFIG
if [[ -z "${KUBEBUILDER_ASSETS:-}" && -z "${SCALINGRUN_TEST_KUBECONFIG:-}" && -x "$ENVTEST_BUILDER" ]]; then
  # The node cluster's build makes the same API server with the node's components too: it goes first,
  # or a cached API-server-only build would stand in its way.
  if [[ $# -eq 0 && -x "$NODE_BUILDER" ]]; then bash "$NODE_BUILDER" >/dev/null; fi
  KUBEBUILDER_ASSETS="$(bash "$ENVTEST_BUILDER" | tail -n1)"
  export KUBEBUILDER_ASSETS
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
if [[ $# -gt 0 ]]; then
  exec "$ROOT/.venv/bin/python" -m pytest "$@"
fi
status=0
"$ROOT/.venv/bin/python" -m pytest -m "not e2e" || status=$?
bash scripts/e2e.sh || status=$?
exit "$status"
