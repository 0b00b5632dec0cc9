#!/usr/bin/env bash
# Builds the CPU trainer images, the operator image and the examples' images (built FROM the trainer), then
# checks that they run as the MPIJob and the chart expect (skip with --no-check). Progress, build times and sizes
# go to stderr; stdout is only the machine-readable result, on its last lines:
#   base=<base image used>
#   trainer=ghcr.io/scalingrun/trainer:<version>-cpu
#   trainer-lightning=ghcr.io/scalingrun/trainer:<version>-lightning-cpu
#   operator=ghcr.io/scalingrun/operator:<version>
#   example-custom-model=ghcr.io/scalingrun/example-custom-model:<version>-cpu   (examples/custom-model, FROM trainer)
#   example-custom-model-lightning=ghcr.io/scalingrun/example-custom-model:<version>-lightning-cpu  (FROM trainer-lightning)
#   example-custom-training=ghcr.io/scalingrun/example-custom-training:<version>-cpu  (examples/custom-training, FROM trainer)
# One image scheme everywhere: these are the names the chart, the API's defaults (scalingrun_api.models.common), the
# examples and .github/workflows/release.yml use, so images built here are the defaults a cluster on this Docker
# runs (tests/unit/repository/test_image_names.py checks that they agree).
# Env: SCALINGRUN_IMAGE_REGISTRY (default ghcr.io/scalingrun), SCALINGRUN_BASE_IMAGE (default: local/python:3.11-bookworm when present, as on machines without
#   Docker Hub, else the Dockerfiles' python:3.11-slim-bookworm), SCALINGRUN_IMAGE_TAG (default: the
#   project version), SCALINGRUN_CACHE (where setup.sh caches the Horovod wheel), DOCKER (default:
#   /usr/bin/docker when present, the Debian client, else docker).
# A Horovod wheel cached by scripts/setup.sh is handed to the build (build/wheels), so a build on a
# machine that ran setup.sh does not compile Horovod again.
# --names prints, instead, every image name (the CPU ones above and the GPU flavours) as name=image, builds nothing.
# --gpu builds, instead, the two GPU flavours (same Debian base, CUDA libraries from the PyPI wheels of the locks;
# see Dockerfile.trainer), with their build times and sizes on stderr and, on stdout:
#   trainer-gpu=ghcr.io/scalingrun/trainer:<version>-gpu
#   trainer-lightning-gpu=ghcr.io/scalingrun/trainer:<version>-lightning-gpu
# then check them with scripts/verify-image.sh --gpu. Several GB of downloads and about half an hour on 2 cores:
# not part of scripts/test.sh or the e2e.
# --gpu-commands prints the docker builds that --gpu runs (and .github/workflows/release.yml repeats), which
# tests/unit/repository/test_dockerfiles.py checks against the locks without building.
# --registry REG builds the images as REG/operator:<version>, REG/trainer:<version>-<flavour>, ... (instead of
# SCALINGRUN_IMAGE_REGISTRY). --push then pushes, once they are built and checked, each image (docker push) and,
# unless --gpu, the chart as an OCI artifact: helm package, helm push to oci://REG/charts (log in first:
# docker login REG, helm registry login REG). The chart's appVersion must be the image tag: it names the images.
# --dry-run (with --push) prints the push commands, one a line, and builds and pushes nothing
# (tests/unit/repository/test_build_images_push.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
USAGE="usage: $0 [--no-check | --names | --gpu | --gpu-commands] [--registry REG] [--push [--dry-run]]"
CHECK=1 MODE= PUSH=0 DRY_RUN=0 REGISTRY_FLAG=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-check|--gpu|--gpu-commands|--names)
      [[ -z "$MODE" ]] || { echo "$0: $MODE and $1 cannot be combined" >&2; echo "$USAGE" >&2; exit 2; }
      MODE="$1" ;;
    --registry)
      [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || { echo "$0: --registry needs a registry, e.g. --registry registry.example.com/ml" >&2; exit 2; }
      REGISTRY_FLAG="${2%/}"; shift ;;
    --registry=*) REGISTRY_FLAG="${1#--registry=}"; REGISTRY_FLAG="${REGISTRY_FLAG%/}"
      [[ -n "$REGISTRY_FLAG" ]] || { echo "$0: --registry needs a registry" >&2; exit 2; } ;;
    --push) PUSH=1 ;;
    --dry-run) DRY_RUN=1 ;;
    *) echo "$0: unknown argument $1" >&2; echo "$USAGE" >&2; exit 2 ;;
  esac
  shift
done
case "$MODE" in
  --no-check) CHECK=0 ;;
  --gpu) CHECK=gpu ;;
  --gpu-commands) CHECK=gpu-commands ;;
  --names) CHECK=names ;;
esac
if [[ "$DRY_RUN" == 1 && "$PUSH" == 0 ]]; then echo "$0: --dry-run prints what --push runs: give both" >&2; exit 2; fi
if [[ "$PUSH" == 1 && ( "$CHECK" == names || "$CHECK" == gpu-commands ) ]]; then
  echo "$0: --push pushes what a build makes; $MODE builds nothing" >&2; exit 2
fi
# BuildKit (built into Docker 20.10+, no frontend image to pull) skips the stages a build does not need.
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-1}"
if [[ -z "${DOCKER:-}" ]]; then DOCKER=docker; [[ -x /usr/bin/docker ]] && DOCKER=/usr/bin/docker; fi
CACHE="${SCALINGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalingrun}"
VERSION="${SCALINGRUN_IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}"
REGISTRY="${REGISTRY_FLAG:-${SCALINGRUN_IMAGE_REGISTRY:-ghcr.io/scalingrun}}"
TRAINER="$REGISTRY/trainer:$VERSION-cpu"
TRAINER_LIGHTNING="$REGISTRY/trainer:$VERSION-lightning-cpu"
TRAINER_GPU="$REGISTRY/trainer:$VERSION-gpu"
TRAINER_LIGHTNING_GPU="$REGISTRY/trainer:$VERSION-lightning-gpu"
OPERATOR="$REGISTRY/operator:$VERSION"
EXAMPLE_MODEL="$REGISTRY/example-custom-model:$VERSION-cpu"
EXAMPLE_MODEL_LIGHTNING="$REGISTRY/example-custom-model:$VERSION-lightning-cpu"
EXAMPLE_TRAINING="$REGISTRY/example-custom-training:$VERSION-cpu"
NODE_CLUSTER="$ROOT/../shared/node/cluster.sh"
# The GPU flavours' build args (the base image is the CPU ones'). Lightning: no torch index, torch-cuda.txt's
# wheels are PyPI's (setup.sh takes that lock with SCALINGRUN_GPU=1).
GPU_KERAS_ARGS=(--build-arg SCALINGRUN_GPU=1)
GPU_LIGHTNING_ARGS=(--build-arg SCALINGRUN_FRAMEWORK=pytorch-lightning --build-arg SCALINGRUN_GPU=1
  --build-arg TORCH_INDEX=)

if [[ "$CHECK" == gpu-commands ]]; then
  echo "DOCKER_BUILDKIT=1 docker build -f Dockerfile.trainer ${GPU_KERAS_ARGS[*]} -t $TRAINER_GPU ."
  echo "DOCKER_BUILDKIT=1 docker build -f Dockerfile.trainer ${GPU_LIGHTNING_ARGS[*]} -t $TRAINER_LIGHTNING_GPU ."
  exit 0
fi
# What --push runs, one command a line (--dry-run prints them): the images of this build, then (not for --gpu) the chart.
push_plan() {
  local image chart_version
  if [[ "$CHECK" == gpu ]]; then
    for image in "$TRAINER_GPU" "$TRAINER_LIGHTNING_GPU"; do echo "$DOCKER push $image"; done
    return
  fi
  for image in "$TRAINER" "$TRAINER_LIGHTNING" "$OPERATOR" "$EXAMPLE_MODEL" "$EXAMPLE_MODEL_LIGHTNING" \
      "$EXAMPLE_TRAINING"; do
    echo "$DOCKER push $image"
  done
  chart_version="$(sed -n 's/^version: *//p' charts/scalingrun/Chart.yaml)"
  echo "$HELM package charts/scalingrun --destination build/charts"
  echo "$HELM push build/charts/scalingrun-$chart_version.tgz oci://$REGISTRY/charts"
}
if [[ "$PUSH" == 1 ]]; then
  APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/scalingrun/Chart.yaml)"
  if [[ "$CHECK" != gpu && "$APP_VERSION" != "$VERSION" ]]; then
    echo "$0: the chart's appVersion ($APP_VERSION) is not the image tag ($VERSION): the pushed chart would name" \
      "other images. Push the project's version (unset SCALINGRUN_IMAGE_TAG) or change both (docs/install.md)" >&2
    exit 2
  fi
  if [[ "$DRY_RUN" == 1 ]]; then HELM=helm; else HELM="${HELM:-$(bash scripts/tools.sh)/helm}"; fi
fi
if [[ "$DRY_RUN" == 1 ]]; then
  push_plan
  exit 0
fi
push() {
  local command
  while read -r -a command <&3; do
    printf '[build-images] pushing: %s\n' "${command[*]}" >&2
    "${command[@]}" >&2 || { printf '[build-images] FAILED: %s\n' "${command[*]}" >&2; exit 1; }
  done 3< <(push_plan)
  [[ "$CHECK" == gpu ]] || rm -rf build/charts
}
if [[ "$CHECK" == names ]]; then
  printf '%s\n' "trainer=$TRAINER" "trainer-lightning=$TRAINER_LIGHTNING" "trainer-gpu=$TRAINER_GPU" \
    "trainer-lightning-gpu=$TRAINER_LIGHTNING_GPU" "operator=$OPERATOR" "example-custom-model=$EXAMPLE_MODEL" \
    "example-custom-model-lightning=$EXAMPLE_MODEL_LIGHTNING" "example-custom-training=$EXAMPLE_TRAINING"
  exit 0
fi

log() { printf '[build-images] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if ! "$DOCKER" info >/dev/null 2>&1; then
  [[ -x "$NODE_CLUSTER" ]] || fail "no Docker daemon answers ($DOCKER info); start one"
  log "starting dockerd ($NODE_CLUSTER docker-up)"
  bash "$NODE_CLUSTER" docker-up >&2
fi

BASE="${SCALINGRUN_BASE_IMAGE:-}"
if [[ -z "$BASE" ]] && "$DOCKER" image inspect local/python:3.11-bookworm >/dev/null 2>&1; then
  BASE=local/python:3.11-bookworm
fi
base_args=()
[[ -z "$BASE" ]] || base_args=(--build-arg "BASE_IMAGE=$BASE")

# The CPU wheel only: its cache directory names the Horovod, TensorFlow and Python versions it was built for;
# setup.sh in the image takes the one it would build. It links the host's Open MPI (libmpi.so.40): fine from a
# Debian/Ubuntu host, and the trainer check below imports it.
rm -rf build/wheels && mkdir -p build/wheels
# Only a wheel built from the sdist whose hash requirements/horovod.txt pins (setup.sh names its folder after it).
HOROVOD_SDIST_HASH="$(sed -n 's/.*--hash=sha256:\([0-9a-f]*\).*/\1/p' requirements/horovod.txt)"
for wheels in "$CACHE"/wheels/horovod-*-"${HOROVOD_SDIST_HASH:0:12}"-*-cpu-py311; do
  if ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    cp -r "$wheels" build/wheels/ && log "using the cached Horovod wheel $(basename "$wheels")"
  fi
done

# The Lightning flavour's torch: the CPU wheel of the lock's version when the host has it (pip's find-links,
# SCALINGRUN_TORCH_WHEELS, default /opt/wheels); else the image takes it from PyTorch's CPU index.
TORCH_VERSION="$(sed -n 's/^torch==\([0-9.]*\)+cpu.*/\1/p' requirements/torch-cpu.txt)"
torch_args=()
for wheel in "${SCALINGRUN_TORCH_WHEELS:-/opt/wheels}"/torch-"$TORCH_VERSION"+cpu-cp311-*.whl; do
  if [[ -f "$wheel" ]]; then
    mkdir -p build/wheels/torch && cp "$wheel" build/wheels/torch/ && log "using the host's torch wheel $(basename "$wheel")"
    # No second index then: where PyTorch's is unreachable, pip would retry it for every package.
    torch_args=(--build-arg TORCH_INDEX=)
  fi
done

# The trainer images' Python packages, fetched once through the host's pip (its index, or the machine's local mirror)
# into build/wheels/pip: the image builds install the locks from there with no index (setup.sh), each file still
# checked against its hash. Only where the host's Python is the images' (Linux, 3.11, so the same wheels); a failed
# download leaves none, and the builds fetch from PyPI as before.
wheelhouse() {
  local locks=(bootstrap trainer lightning petastorm) py=python3 started=$SECONDS lock cached
  [[ ! -x .venv/bin/python ]] || py=.venv/bin/python
  [[ "$(uname -s)" == Linux ]] && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || return 0
  # Kept in the cache under the locks' digest: a second build downloads nothing.
  cached="$CACHE/wheelhouse-$(for lock in "${locks[@]}"; do cat "requirements/$lock.txt"; done | sha256sum | cut -c1-16)"
  if [[ ! -d "$cached" ]]; then
    rm -rf "$cached.tmp" && mkdir -p "$cached.tmp"
    for lock in "${locks[@]}"; do
      if ! "$py" -m pip download -q --disable-pip-version-check --require-hashes --no-deps -d "$cached.tmp" \
          -r "requirements/$lock.txt" >&2; then
        log "no wheelhouse: requirements/$lock.txt did not download here; the images fetch from PyPI"
        rm -rf "$cached.tmp"
        return 0
      fi
    done
    mv "$cached.tmp" "$cached"
  fi
  cp -al "$cached" build/wheels/pip 2>/dev/null || cp -r "$cached" build/wheels/pip  # hard links where they can be
  log "wheelhouse: $(find "$cached" -type f | wc -l) files, $(du -sm "$cached" | cut -f1) MB in $((SECONDS - started)) s"
}
[[ "$CHECK" == gpu ]] || wheelhouse

build() {  # build NAME TAG DOCKERFILE [BUILD ARGS...]
  local started=$SECONDS size name="$1" tag="$2" dockerfile="$3"
  shift 3
  log "building $tag from $dockerfile${BASE:+ (base $BASE)} $*"
  "$DOCKER" build "${base_args[@]}" "$@" -f "$dockerfile" -t "$tag" . >&2 || fail "docker build of $dockerfile $*"
  size="$("$DOCKER" image inspect -f '{{.Size}}' "$tag")"
  log "$name: $tag built in $((SECONDS - started)) s, $((size / 1000000)) MB"
}
if [[ "$CHECK" == gpu ]]; then
  # Nothing from the host: no CPU Horovod wheel, no CPU torch wheel (the folder stays for the COPY). The builder
  # stage compiles Horovod with NCCL (its rpath names the image's venv, so a host-built wheel would not do).
  rm -rf build/wheels && mkdir -p build/wheels
  build trainer-gpu "$TRAINER_GPU" Dockerfile.trainer "${GPU_KERAS_ARGS[@]}"
  build trainer-lightning-gpu "$TRAINER_LIGHTNING_GPU" Dockerfile.trainer "${GPU_LIGHTNING_ARGS[@]}"
  [[ "$PUSH" == 0 ]] || push
  echo "base=$BASE"
  echo "trainer-gpu=$TRAINER_GPU"
  echo "trainer-lightning-gpu=$TRAINER_LIGHTNING_GPU"
  exit 0
fi
build trainer "$TRAINER" Dockerfile.trainer
build trainer-lightning "$TRAINER_LIGHTNING" Dockerfile.trainer --build-arg SCALINGRUN_FRAMEWORK=pytorch-lightning \
  "${torch_args[@]}"
build operator "$OPERATOR" Dockerfile.operator
# The examples' images, as a user builds theirs: their package FROM the trainer image just built.
example() {  # example NAME TAG FOLDER TRAINER_IMAGE
  local started=$SECONDS
  "$DOCKER" build --build-arg "TRAINER_IMAGE=$4" -t "$2" "$3" >&2 || fail "docker build of $3 FROM $4"
  log "$1: $2 built FROM $4 in $((SECONDS - started)) s"
}
example example-custom-model "$EXAMPLE_MODEL" examples/custom-model "$TRAINER"
example example-custom-model-lightning "$EXAMPLE_MODEL_LIGHTNING" examples/custom-model "$TRAINER_LIGHTNING"
example example-custom-training "$EXAMPLE_TRAINING" examples/custom-training "$TRAINER"

# What the MPIJob and the chart rely on, checked in the images themselves.
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what="$1"; shift
  "$@" >/dev/null 2>&1 || fail "check: $what"
}
sshd_check() {
  local worker address
  worker="$("$DOCKER" run -d --rm --user 1000:1000 --cap-drop ALL --security-opt no-new-privileges "$TRAINER")"
  address="$("$DOCKER" inspect -f '{{.NetworkSettings.IPAddress}}' "$worker")"
  # The launcher's own wait, from a second container: sshd answers on port 2222 with no command given.
  "$DOCKER" run --rm --entrypoint sh "$TRAINER" -c \
    "echo '$address slots=1' > /tmp/hostfile && scalingrun-trainer launch --hostfile /tmp/hostfile --timeout 60 -- true" >&2 \
    || { "$DOCKER" logs "$worker" >&2; "$DOCKER" rm -f "$worker" >/dev/null; fail "check: sshd as uid 1000 on port 2222"; }
  "$DOCKER" exec "$worker" test -s /home/mpiuser/.sshd/ssh_host_ed25519_key \
    || { "$DOCKER" rm -f "$worker" >/dev/null; fail "check: the entrypoint made no host key"; }
  "$DOCKER" rm -f "$worker" >/dev/null
}
if [[ "$CHECK" == 1 ]]; then
  log "checking the images"
  check "scalingrun-trainer --help" "$DOCKER" run --rm "$TRAINER" scalingrun-trainer --help
  check "the training stack imports" \
    "$DOCKER" run --rm "$TRAINER" python -c 'import horovod.tensorflow.keras, petastorm, pyarrow'
  check "mpirun --version" "$DOCKER" run --rm "$TRAINER" mpirun --version
  check "uid 1000 and no compilers in the trainer" "$DOCKER" run --rm "$TRAINER" sh -c \
    '[ "$(id -u)" = 1000 ] && ! command -v gcc && ! command -v g++ && ! command -v cc && ! command -v cmake'
  # The entrypoint, which makes a host key, is bypassed here.
  check "no ssh host key in the trainer image" "$DOCKER" run --rm --entrypoint sh "$TRAINER" -c \
    '[ -z "$(find / -xdev -name "ssh_host_*" 2>/dev/null)" ]'
  sshd_check
  TRAINER="$TRAINER_LIGHTNING" sshd_check
  check "the Lightning stack imports" "$DOCKER" run --rm "$TRAINER_LIGHTNING" python -c \
    'import torch, pytorch_lightning, petastorm.pytorch, mpi4py, scalingrun_trainer.engines.lightning_ddp.train'
  check "no TensorFlow, Horovod or kopf in the Lightning trainer" "$DOCKER" run --rm "$TRAINER_LIGHTNING" python -c \
    'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ("tensorflow", "horovod", "kopf")))'
  check "uid 1000 and mpirun in the Lightning trainer" "$DOCKER" run --rm "$TRAINER_LIGHTNING" sh -c \
    '[ "$(id -u)" = 1000 ] && mpirun --version'
  check "scalingrun-operator --help" "$DOCKER" run --rm "$OPERATOR" --help
  check "uid 1000 and no TensorFlow in the operator" "$DOCKER" run --rm --entrypoint sh "$OPERATOR" -c \
    '[ "$(id -u)" = 1000 ] && ! python -c "import tensorflow"'
  # The builder contract (import, signature, output shape) holds in the examples' images, as the trainer checks it.
  check "teamnets.keras_cnn:build in $EXAMPLE_MODEL" "$DOCKER" run --rm "$EXAMPLE_MODEL" python -c \
    'from scalingrun_trainer.core.builder import Builder; from scalingrun_trainer.frameworks.keras.models import build_user_network; build_user_network(Builder("teamnets.keras_cnn:build"), 32, 10)'
  check "teamnets.torch_cnn:build in $EXAMPLE_MODEL_LIGHTNING" "$DOCKER" run --rm "$EXAMPLE_MODEL_LIGHTNING" python -c \
    'from scalingrun_trainer.core.builder import Builder; from scalingrun_trainer.frameworks.lightning.network import build_network; build_network(Builder("teamnets.torch_cnn:build"), 32, 10)'
  check "teamtrain.keras_horovod imports in $EXAMPLE_TRAINING" "$DOCKER" run --rm "$EXAMPLE_TRAINING" python -c \
    'import teamtrain.keras_horovod'
  log "checks passed"
fi
[[ "$PUSH" == 0 ]] || push

echo "base=$BASE"  # empty: the Dockerfiles' default
echo "trainer=$TRAINER"
echo "trainer-lightning=$TRAINER_LIGHTNING"
echo "operator=$OPERATOR"
echo "example-custom-model=$EXAMPLE_MODEL"
echo "example-custom-model-lightning=$EXAMPLE_MODEL_LIGHTNING"
echo "example-custom-training=$EXAMPLE_TRAINING"
