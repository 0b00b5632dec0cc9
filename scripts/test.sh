#!/usr/bin/env bash
# The test command: installs the pinned stack (cached), provides a real Kubernetes API server, runs pytest and,
# beside it, the end-to-end test in a real cluster (scripts/e2e.sh).
# The tests start their own API server from KUBEBUILDER_ASSETS; when it is not set and the workplace's envtest
# builder is beside the checkout (../shared/envtest), it is built (cached). An existing cluster is used only
# when named for the tests: SCALINGRUN_TEST_KUBECONFIG=<path> (an ambient KUBECONFIG is never used).
# With arguments, only pytest runs, with them: scripts/test.sh tests/unit -x
# --under-load first: the whole command (or pytest alone, with arguments) runs beside a CPU hog, one busy loop per
# core, to shake out verdicts that the machine's load decides, as CI's shared cores would (docs/testing.md).
#
# The whole run goes in phases, each timed (docs/testing.md, "The budget"):
#   system packages  every Debian package of setup and of the two builders, in one apt-get (so that no two apt-gets
#                ever run at once: apt-get update cannot wait for another's lock)
#   setup        the venvs (scripts/setup.sh), beside the builds
#   builds       in the background from the start: the API server's binaries, then the node cluster
#   e2e          scripts/e2e.sh (our images, then the in-cluster tests), in the background as soon as the node
#                cluster is built; its output goes to .scalingrun/test-budget/e2e.log and is printed when it ends
#   unit         tests/unit and tests/chart, which need none of it, while the builds run
#   integration  the rest of pytest, once the API server's binaries are there, beside the e2e: the e2e's pods are
#                held to their CPU limits, and most of these tests wait (on an API server, an operator, a store)
# pytest runs on SCALINGRUN_TEST_WORKERS processes (pytest-xdist, default 4; 0 = one process): the files of the
# tests that train go to SCALINGRUN_TRAINING_LANES lanes (default 2), one test after another in each, the other
# tests by file (tests/conftest.py). At the end the phases and the 25 slowest tests are printed
# (scripts/test_budget.py), and kept in .scalingrun/test-budget/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NODE_BUILDER="${SCALINGRUN_NODE_DIR:-$ROOT/../shared/node}/build.sh"
ENVTEST_BUILDER="${SCALINGRUN_ENVTEST_BUILDER:-$ROOT/../shared/envtest/build-assets.sh}"
WORKERS="${SCALINGRUN_TEST_WORKERS:-4}"
unset KUBECONFIG
if [[ "${1:-}" == "--under-load" ]]; then
  shift
  # One busy loop per core at the tests' own priority, for the whole command; ended with it.
  HOGS=()
  for _ in $(seq "$(nproc)"); do (while :; do :; done) & HOGS+=($!); done
  trap 'kill "${HOGS[@]}" 2>/dev/null || true' EXIT
  echo "[test] under load: $(nproc) busy loops beside the tests (pids ${HOGS[*]})" >&2
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# Whether this run builds its own API server (and, for the whole suite, the node cluster).
builds_api_server() { [[ -z "${KUBEBUILDER_ASSETS:-}" && -z "${SCALINGRUN_TEST_KUBECONFIG:-}" && -x "$ENVTEST_BUILDER" ]]; }
# The node builder wants the API server's binaries with the scheduler and kube-proxy beside them (a cached build
# without those stands in its way), so with a node builder they are built together, in one go; the node builder
# then finds them built and relinks only its kubelet.
api_server_binaries() {
  local what="cmd/kube-apiserver cmd/kube-controller-manager"
  [[ ! -x "$NODE_BUILDER" ]] || what+=" cmd/kube-scheduler cmd/kube-proxy"
  WHAT="$what" bash "$ENVTEST_BUILDER" | tail -n1
}

if [[ $# -gt 0 ]]; then
  bash scripts/setup.sh
  # The PyTorch Lightning venv (.venv-lightning), for tests/lightning.
  if [[ "$*" == *lightning* ]]; then SCALINGRUN_PROFILE=lightning bash scripts/setup.sh; fi
  if builds_api_server; then KUBEBUILDER_ASSETS="$(api_server_binaries)"; export KUBEBUILDER_ASSETS; fi
  status=0
  "$ROOT/.venv/bin/python" -m pytest "$@" || status=$?
  exit "$status"
fi

BUDGET="$ROOT/.scalingrun/test-budget"
rm -rf "$BUDGET" && mkdir -p "$BUDGET"
T0=$SECONDS
exec 3>&2  # the phases' lines, also from the background chain whose output goes to a log
log() { printf '[test %s] %s\n' "$(date +%T)" "$*" >&3; }
# phase NAME COMMAND...: runs the command, and records when it started (seconds from the start) and how long it took.
phase() {
  local name="$1" start=$SECONDS rc=0
  shift
  log "$name: started"
  "$@" || rc=$?
  printf '%s\t%d\t%d\t%d\n' "$name" $((start - T0)) $((SECONDS - start)) "$rc" >> "$BUDGET/phases.tsv"
  log "$name: $((SECONDS - start)) s (exit $rc)"
  return "$rc"
}
xdist_args() { if [[ "$WORKERS" -gt 0 ]]; then echo "-n $WORKERS --dist loadgroup"; fi; }
pytest_phase() {  # pytest_phase NAME ARGS...: pytest with the phase's junit report (for the slowest tests)
  local name="$1"; shift
  # shellcheck disable=SC2046
  "$ROOT/.venv/bin/python" -m pytest $(xdist_args) --junitxml="$BUDGET/$name.xml" "$@"
}
setup() { bash scripts/setup.sh && SCALINGRUN_PROFILE=lightning bash scripts/setup.sh && previous_release; }
# The builders' Debian packages (the envtest builder's and the node builder's own lists, and deb-src for the API
# server's source package), installed with setup's before anything runs beside: each builder then finds its
# packages there, and only its `apt-get update` runs, while setup's apt-get has nothing to do.
BUILDER_PACKAGES=(golang-go rsync jq make dpkg-dev etcd-server openssl curl golang-github-modern-go-reflect2-dev
  docker.io debootstrap containernetworking-plugins dnsmasq-base gcc libc6-dev iptables conntrack socat ethtool
  ebtables iproute2 procps kmod util-linux bc xz-utils)
system_packages() {
  local extra=()
  if builds_api_server || [[ -x "$NODE_BUILDER" ]]; then
    extra=("${BUILDER_PACKAGES[@]}")
    if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/*.sources && [[ -f /etc/apt/sources.list.d/debian.sources \
        && -w /etc/apt/sources.list.d ]]; then
      sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        > /etc/apt/sources.list.d/debian-src.sources
    fi
  fi
  SCALINGRUN_SYSTEM_PACKAGES_ONLY=1 SCALINGRUN_EXTRA_SYSTEM_PACKAGES="${extra[*]}" bash scripts/setup.sh
}
# The upgrade tests install the release tests/e2e/previous-release names, from git: a shallow clone fetches it first.
previous_release() {
  local commit; commit="$(sed -n 's/^commit=//p' tests/e2e/previous-release)"
  git cat-file -e "$commit^{commit}" 2>/dev/null && return 0
  echo "fetching $commit (tests/e2e/previous-release): this clone lacks it" >&2
  git fetch --quiet origin "$commit" 2>/dev/null || git fetch --quiet --unshallow origin ||
    echo "could not fetch $commit: the upgrade tests will say so" >&2
}

# The API server's binaries, then the node cluster: the background chain's first steps; the integration tests wait
# for the first (the file "assets").
build_api_server() {
  api_server_binaries > "$BUDGET/assets.tmp" && mv "$BUDGET/assets.tmp" "$BUDGET/assets" || { touch "$BUDGET/assets.failed"; return 1; }
}
build_node_cluster() { bash "$NODE_BUILDER" > /dev/null; }
builds() {
  if builds_api_server; then phase "build: API server" build_api_server || return 1; fi
  if [[ -z "${SCALINGRUN_TEST_KUBECONFIG:-}" && -x "$NODE_BUILDER" ]]; then
    phase "build: node cluster" build_node_cluster || return 1
  fi
}
# Waits for the background chain to have made the API server's binaries (or to have gone past that step without).
wait_for_api_server() {
  while [[ ! -s "$BUDGET/assets" && ! -e "$BUDGET/assets.failed" ]] && kill -0 "$BUILDS" 2>/dev/null; do sleep 1; done
  [[ -s "$BUDGET/assets" ]] || { log "the API server's build failed: $BUDGET/builds.log"; tail -n 30 "$BUDGET/builds.log" >&2; return 1; }
  KUBEBUILDER_ASSETS="$(cat "$BUDGET/assets")"
  export KUBEBUILDER_ASSETS
}

# The builds, then the e2e: one background chain. A failed build leaves its message in builds.log; the e2e then
# tries the node cluster's build itself and fails saying why.
background() {
  builds > "$BUDGET/builds.log" 2>&1 || log "a build failed: $BUDGET/builds.log"
  # The e2e uses the venvs: it starts once setup, in the foreground, has made them (never beside it).
  while [[ ! -e "$BUDGET/setup.done" ]]; do
    [[ ! -e "$BUDGET/setup.failed" ]] || return 1
    sleep 1
  done
  phase e2e bash scripts/e2e.sh --junitxml="$BUDGET/e2e.xml" > "$BUDGET/e2e.log" 2>&1
}

status=0
phase "system packages" system_packages || status=$?
background &
BUILDS=$!
phase setup setup || { touch "$BUDGET/setup.failed"; log "setup failed: nothing can run without it"; exit 1; }
touch "$BUDGET/setup.done"
phase unit pytest_phase unit tests/unit tests/chart || status=$?
if builds_api_server; then phase "wait: API server build" wait_for_api_server || status=$?; fi
phase integration pytest_phase integration -m "not e2e" --ignore=tests/unit --ignore=tests/chart || status=$?
e2e_status=0
phase "wait: e2e" wait "$BUILDS" || e2e_status=$?
[[ ! -s "$BUDGET/builds.log" ]] || { log "the builds' output (builds.log), last lines:"; tail -n 15 "$BUDGET/builds.log" >&2; }
log "the e2e's output (e2e.log):"
cat "$BUDGET/e2e.log" >&2 || true
[[ "$e2e_status" -eq 0 ]] || status=$e2e_status
printf '%s\t%d\t%d\t%d\n' "in all" 0 $((SECONDS - T0)) "$status" >> "$BUDGET/phases.tsv"
"$ROOT/.venv/bin/python" scripts/test_budget.py "$BUDGET" || true
exit "$status"
