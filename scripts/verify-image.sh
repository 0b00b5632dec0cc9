#!/usr/bin/env bash
# Checks a built image against this checkout's locks (docs/security.md, "Verify an image"): runs
# scripts/verify_installed.py with the image's own Python over its venv (/opt/scalingrun). Exit 1 on any
# difference: a package not in the locks or at another version, a pinned one missing, or an installed file
# whose sha256 is not the one pip recorded when it installed the hash-checked wheel.
# The GPU flavours (gpu, lightning-gpu) then check themselves on this host, which needs no GPU
# (scripts/verify_gpu.py): the CUDA, cuDNN and NCCL libraries load, the framework is a CUDA build (Horovod with
# NCCL in the Keras one), and a ScalingRun asking for a GPU ends Succeeded on the CPU with GPUsUnused saying why.
# Usage: scripts/verify-image.sh IMAGE operator|trainer|lightning|gpu|lightning-gpu
#        scripts/verify-image.sh --gpu     both GPU images that `scripts/build-images.sh --gpu` builds (minutes each)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
if [[ "${1:-}" == --gpu ]]; then
  names="$(bash "$ROOT/scripts/build-images.sh" --names)"
  for flavour in gpu lightning-gpu; do
    image="$(sed -n "s/^trainer-$flavour=//p" <<<"$names")"
    echo "== $image ($flavour)"
    bash "${BASH_SOURCE[0]}" "$image" "$flavour"
  done
  exit 0
fi
IMAGE="${1:?usage: scripts/verify-image.sh IMAGE operator|trainer|lightning|gpu|lightning-gpu, or --gpu}"
FLAVOUR="${2:?flavour: operator, trainer, lightning, gpu or lightning-gpu}"
LOCKS="$(mktemp -d)"; trap 'rm -rf "$LOCKS"' EXIT
cp "$ROOT"/requirements/*.txt "$LOCKS/"
modified=()
case "$FLAVOUR" in
  operator) locks=(operator bootstrap) ;;
  # Dockerfile.trainer strips Horovod's debug symbols after installing it: its .so files differ by design.
  trainer) locks=(trainer bootstrap petastorm horovod); modified=(--modified 'horovod/*.so') ;;
  lightning) locks=(lightning torch-cpu bootstrap petastorm) ;;
  # TensorFlow's GPU wheel replaces tensorflow-cpu (setup.sh); its CUDA set comes with it.
  gpu) sed -i '/^tensorflow-cpu==/d' "$LOCKS/trainer.txt"
    locks=(trainer tensorflow-gpu bootstrap petastorm horovod); modified=(--modified 'horovod/*.so') ;;
  lightning-gpu) locks=(lightning torch-cuda bootstrap petastorm) ;;
  *) echo "flavour must be operator, trainer, lightning, gpu or lightning-gpu" >&2; exit 2 ;;
esac
args=()
for lock in "${locks[@]}"; do args+=("/locks/$lock.txt"); done
chmod -R a+rX "$LOCKS"
"$DOCKER" run --rm --user 0 --entrypoint /opt/scalingrun/bin/python \
  -v "$LOCKS:/locks:ro" -v "$ROOT/scripts/verify_installed.py:/verify_installed.py:ro" \
  "$IMAGE" /verify_installed.py "${modified[@]}" "${args[@]}"
case "$FLAVOUR" in
  gpu | lightning-gpu)
    # As the pods run it: uid 1000, no GPU, no capabilities; the check's files in a tmpfs.
    "$DOCKER" run --rm --user 1000:1000 --cap-drop ALL --security-opt no-new-privileges --tmpfs /work:exec,uid=1000 \
      --entrypoint /opt/scalingrun/bin/python -v "$ROOT/scripts/verify_gpu.py:/verify_gpu.py:ro" \
      "$IMAGE" /verify_gpu.py "$([[ "$FLAVOUR" == gpu ]] && echo keras || echo lightning)" /work ;;
esac
