#!/bin/sh
# The trainer image's entrypoint: gives this container its own ssh host key (none is baked into the
# image, so no two pods share one), then runs its arguments (by default the non-root sshd on port 2222).
# The key lives where /etc/ssh/sshd_config's HostKey points; it is made only once per container.
#
# A preemption notice: the kubelet's SIGTERM reaches only this first process, and the training ranks, which
# mpirun starts through sshd, are no children of it; sshd's end would kill them at once. So the command runs as
# a child, and SIGTERM goes on to every rank that noted its pid in SCALINGRUN_RANK_PIDS_DIR
# (scalingrun_trainer.core.preemption); once they are gone (a checkpoint at their next step, within the pod's
# terminationGracePeriodSeconds) the command gets it too.
set -eu
key=/home/mpiuser/.sshd/ssh_host_ed25519_key
if [ ! -s "$key" ]; then
  rm -f "$key" "$key.pub" 2>/dev/null || true  # a partial key from an interrupted start
  if ! ssh-keygen -q -t ed25519 -N "" -f "$key"; then
    echo "scalingrun-entrypoint: cannot write the ssh host key $key as uid $(id -u): run as uid 1000" \
         "(mpiuser) so that sshd can start" >&2
  fi
fi
ranks=${SCALINGRUN_RANK_PIDS_DIR:-/tmp/scalingrun-ranks}

signal_ranks() {  # $1: the signal; true while a rank that noted its pid still runs
  running=1
  for file in "$ranks"/*; do
    [ -e "$file" ] || continue
    if kill "-$1" "${file##*/}" 2>/dev/null; then running=0; fi
  done
  return $running
}

stop() {
  trap '' TERM INT
  if signal_ranks TERM; then
    echo "scalingrun-entrypoint: SIGTERM passed on to the training ranks; waiting for their checkpoint" >&2
    while signal_ranks 0; do sleep 0.2; done
  fi
  kill -TERM "$command" 2>/dev/null || true
}

"$@" &
command=$!
trap stop TERM INT
set +e
wait "$command"
code=$?
if [ "$code" -gt 128 ] && kill -0 "$command" 2>/dev/null; then
  wait "$command"  # the first wait ended for the signal: now the command's own end
  code=$?
fi
exit "$code"
