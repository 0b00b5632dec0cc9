#!/usr/bin/env bash
# The end-to-end test in a real Kubernetes cluster: our images as pods, the operator installed with the
# README's helm command, SeaweedFS as a pod, an MPIJob controller, ScalingRuns trained over mpirun
# between worker pods (tests/e2e, pytest marker e2e).
#
# Cluster: the one named by SCALINGRUN_TEST_KUBECONFIG=<path> (kind: images are loaded with `kind load
# docker-image`; minikube: `minikube image load`; any other: SCALINGRUN_E2E_REGISTRY=<registry/prefix> to push
# them there). Without it and with ../shared/node beside the checkout, that single-node cluster is built
# (cached) and started. An ambient KUBECONFIG is never used. With neither, the e2e is skipped, saying why
# (exit 0), except when CI is set to anything truthy (true, 1, yes...): there it is a failure (exit 2).
#
# Usage: scripts/e2e.sh [--keep] [pytest args]   run the e2e, then take down what it set up
#        scripts/e2e.sh --keep                     ... and leave the cluster, the operator, SeaweedFS and the
#                                                  MPIJob controller running; the last lines are exports
#        scripts/e2e.sh --down                     remove what it created (and stop the node cluster it started)
# Env: SCALINGRUN_E2E_NAMESPACE (scalingrun-e2e), SCALINGRUN_E2E_MPI_OPERATOR (stand-in | external: a real
#      mpi-operator v0.8 already in the cluster), SCALINGRUN_NODE_DIR (../shared/node),
#      SCALINGRUN_MPIJOB_CRD (the MPIJob CRD for the stand-in; ../shared/crds/kubeflow.org_mpijobs.yaml).
#      With the node cluster, SCALINGRUN_E2E_NODE_DIR is exported to the tests (they stop its kubelet).
#      SCALINGRUN_E2E_STATUS_PUSH: 1 (the default, the chart's): the push path, the operator reads no store and no
#      run's Secret (only its own certificate's); 0: pull mode (statusServer.enabled=false).
# Besides the images of scripts/build-images.sh it builds the previous release's operator (the commit
# tests/e2e/previous-release names; SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE) for tests/e2e/test_upgrade.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE=run
if [[ "${1:-}" == "--keep" || "${1:-}" == "--down" ]]; then MODE="${1#--}"; shift; fi
NODE_DIR="${SCALINGRUN_NODE_DIR:-$ROOT/../shared/node}"
STATE="$ROOT/.scalingrun/e2e"
mkdir -p "$STATE"
log() { printf '[e2e %s] %s\n' "$(date +%T)" "$*" >&2; }
# CI as tests/conftest.py reads it: only unset, empty, 0, false, no or off is not CI.
export SCALINGRUN_E2E_STATUS_PUSH="${SCALINGRUN_E2E_STATUS_PUSH:-1}"
case "$SCALINGRUN_E2E_STATUS_PUSH" in 0|1) ;; *) echo "SCALINGRUN_E2E_STATUS_PUSH must be 1 (push) or 0 (pull), not '$SCALINGRUN_E2E_STATUS_PUSH'" >&2; exit 2 ;; esac
in_ci() { case "$(tr '[:upper:]' '[:lower:]' <<<"${CI:-}" | tr -d '[:space:]')" in ""|0|false|no|off) return 1 ;; esac; }

# Which cluster, decided before anything is installed or built: a clone without one skips at once.
if [[ "$MODE" != down && -z "${SCALINGRUN_TEST_KUBECONFIG:-}" && ! -x "$NODE_DIR/cluster.sh" ]]; then
  reason="no cluster: SCALINGRUN_TEST_KUBECONFIG is not set and there is no node cluster at $NODE_DIR (SCALINGRUN_NODE_DIR)"
  if in_ci; then echo "e2e FAILED: $reason; CI=$CI requires the in-cluster tests" >&2; exit 2; fi
  echo "e2e SKIPPED: $reason. Name a cluster to run the in-cluster tests: SCALINGRUN_TEST_KUBECONFIG=<kubeconfig> scripts/e2e.sh" >&2
  exit 0
fi

bash scripts/setup.sh
SCALINGRUN_TOOLS="$(bash scripts/tools.sh)"
export SCALINGRUN_TOOLS PATH="$SCALINGRUN_TOOLS:$PATH"
unset KUBEBUILDER_ASSETS  # the tests' own API server must not stand in for the cluster
unset KUBECONFIG  # only a cluster named for the tests: SCALINGRUN_TEST_KUBECONFIG, or the node cluster
PY="$ROOT/.venv/bin/python"

start_cluster() {
  if [[ -n "${SCALINGRUN_TEST_KUBECONFIG:-}" ]]; then
    KUBECONFIG="$SCALINGRUN_TEST_KUBECONFIG"
    log "using the cluster SCALINGRUN_TEST_KUBECONFIG names: $KUBECONFIG"
    return
  fi
  local t0=$SECONDS
  bash "$NODE_DIR/build.sh" >/dev/null
  eval "$(bash "$NODE_DIR/cluster.sh" start | tail -n1)"
  echo "$KUBECONFIG" > "$STATE/node-cluster"  # --down stops only a cluster this script started
  # The node's faults (kubelet-stop, docker pause) are this cluster's only: tests/e2e/test_never_hang.py.
  export SCALINGRUN_E2E_NODE_DIR="$NODE_DIR"
  log "node cluster up in $((SECONDS - t0)) s"
}

# Images: built here, then made available to the cluster's nodes.
load_images() {
  local context; context="$(kubectl config current-context 2>/dev/null || true)"
  for image in "$@"; do
    case "$context" in
      kind-*) kind load docker-image "$image" --name "${context#kind-}" ;;
      minikube) minikube image load "$image" ;;
      *)
        if [[ -n "${SCALINGRUN_E2E_REGISTRY:-}" ]]; then
          "$DOCKER" tag "$image" "$SCALINGRUN_E2E_REGISTRY/${image##*/}"
          "$DOCKER" push "$SCALINGRUN_E2E_REGISTRY/${image##*/}"
        fi ;;
    esac
  done
}

build_images() {
  local out
  out="$(bash scripts/build-images.sh)"
  SCALINGRUN_E2E_OPERATOR_IMAGE="$(sed -n 's/^operator=//p' <<<"$out")"
  SCALINGRUN_E2E_TRAINER_IMAGE="$(sed -n 's/^trainer=//p' <<<"$out")"
  SCALINGRUN_E2E_LIGHTNING_IMAGE="$(sed -n 's/^trainer-lightning=//p' <<<"$out")"
  SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE="$(sed -n 's/^example-custom-model=//p' <<<"$out")"
  SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE="$(sed -n 's/^example-custom-training=//p' <<<"$out")"
  local base; base="$(sed -n 's/^base=//p' <<<"$out")"
  SCALINGRUN_E2E_SEAWEEDFS_IMAGE="scalingrun-demo/seaweedfs:4.48"  # scalingrun_demo.seaweedfs.IMAGE, the quick start's too
  "$DOCKER" build -q ${base:+--build-arg "BASE_IMAGE=$base"} -t "$SCALINGRUN_E2E_SEAWEEDFS_IMAGE" \
    tests/e2e/seaweedfs >/dev/null
  build_previous_operator "$base"
  if [[ -n "${SCALINGRUN_E2E_REGISTRY:-}" ]]; then
    load_images "$SCALINGRUN_E2E_OPERATOR_IMAGE" "$SCALINGRUN_E2E_TRAINER_IMAGE" "$SCALINGRUN_E2E_SEAWEEDFS_IMAGE" \
      "$SCALINGRUN_E2E_LIGHTNING_IMAGE" "$SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE" "$SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE"
    SCALINGRUN_E2E_OPERATOR_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_OPERATOR_IMAGE##*/}"
    SCALINGRUN_E2E_TRAINER_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_TRAINER_IMAGE##*/}"
    SCALINGRUN_E2E_LIGHTNING_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_LIGHTNING_IMAGE##*/}"
    SCALINGRUN_E2E_SEAWEEDFS_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_SEAWEEDFS_IMAGE##*/}"
    SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE##*/}"
    SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE##*/}"
    if [[ -n "$SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE" ]]; then
      load_images "$SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE"
      SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE="$SCALINGRUN_E2E_REGISTRY/${SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE##*/}"
    fi
  else
    load_images "$SCALINGRUN_E2E_OPERATOR_IMAGE" "$SCALINGRUN_E2E_TRAINER_IMAGE" "$SCALINGRUN_E2E_SEAWEEDFS_IMAGE" \
      "$SCALINGRUN_E2E_LIGHTNING_IMAGE" "$SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE" "$SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE"
    [[ -z "$SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE" ]] || load_images "$SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE"
  fi
  export SCALINGRUN_E2E_OPERATOR_IMAGE SCALINGRUN_E2E_TRAINER_IMAGE SCALINGRUN_E2E_SEAWEEDFS_IMAGE SCALINGRUN_E2E_LIGHTNING_IMAGE \
    SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE
}

# The previous release's operator (tests/e2e/previous-release names its commit), for tests/e2e/test_upgrade.py: built
# from that commit's own tree and Dockerfile.operator. A clone without that commit (a shallow one) builds nothing,
# and the test says what to fetch.
build_previous_operator() {
  local commit; commit="$(sed -n 's/^commit=//p' tests/e2e/previous-release)"
  SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE=""
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    log "no commit $commit in this clone (git fetch --unshallow): the previous operator is not built"
    return 0
  fi
  local image="ghcr.io/scalingrun/operator:previous-${commit:0:12}" t0=$SECONDS
  git archive --format=tar "$commit" | "$DOCKER" build -q ${1:+--build-arg "BASE_IMAGE=$1"} -f Dockerfile.operator \
    -t "$image" - >/dev/null
  SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE="$image"
  log "previous operator $image (commit ${commit:0:12}) ready in $((SECONDS - t0)) s"
}

down() {
  if [[ -f "$STATE/node-cluster" ]]; then  # a node cluster this script started: stopping it removes it all
    bash "$NODE_DIR/cluster.sh" stop >&2
    rm -f "$STATE/node-cluster"
  elif [[ -n "${SCALINGRUN_TEST_KUBECONFIG:-}" ]]; then
    KUBECONFIG="$SCALINGRUN_TEST_KUBECONFIG" "$PY" -m tests.e2e.environment down || true
  fi
}

if [[ "$MODE" == down ]]; then down; exit 0; fi

t0=$SECONDS
# Without --keep, whatever happens from here on (a failed install included) ends with everything taken down.
[[ "$MODE" == keep ]] || trap down EXIT
start_cluster
export KUBECONFIG
export SCALINGRUN_TEST_KUBECONFIG="$KUBECONFIG"  # the name the tests take their cluster by
# The same client as scripts/build-images.sh: Debian's, matching the node cluster's Docker 20.10, when present.
if [[ -z "${DOCKER:-}" ]]; then DOCKER=docker; [[ -x /usr/bin/docker ]] && DOCKER=/usr/bin/docker; fi
export DOCKER
t_images=$SECONDS
build_images
log "images ready in $((SECONDS - t_images)) s"
exports="$("$PY" -m tests.e2e.environment up)"
[[ -z "${SCALINGRUN_E2E_NODE_DIR:-}" ]] || exports+=$'\n'"export SCALINGRUN_E2E_NODE_DIR=$SCALINGRUN_E2E_NODE_DIR"
exports+=$'\n'"export SCALINGRUN_E2E_OPERATOR_IMAGE=$SCALINGRUN_E2E_OPERATOR_IMAGE"
exports+=$'\n'"export SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE=$SCALINGRUN_E2E_PREVIOUS_OPERATOR_IMAGE"
eval "$exports"
log "cluster, images and services ready in $((SECONDS - t0)) s"

status=0
# Paths among the arguments (tests/e2e/test_doctor.py, ...::test_x) run alone; without one, the whole tests/e2e.
TARGETS=(tests/e2e)
for arg in "$@"; do [[ "$arg" == tests/* ]] && TARGETS=(); done
"$PY" -m pytest -m e2e "${TARGETS[@]}" -p no:cacheprovider "$@" || status=$?
log "e2e finished in $((SECONDS - t0)) s (exit $status)"

[[ "$MODE" != keep ]] || printf '%s\n' "$exports"
exit "$status"
