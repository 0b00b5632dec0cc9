#!/bin/sh
# The trainer image's entrypoint: gives this container its own ssh host key (none is baked into the
# image, so no two pods share one), then runs its arguments (by default the non-root sshd on port 2222).
# The key lives where /etc/ssh/sshd_config's HostKey points; it is made only once per container.
set -eu
key=/home/mpiuser/.sshd/ssh_host_ed25519_key
if [ ! -s "$key" ]; then
  rm -f "$key" "$key.pub" 2>/dev/null || true  # a partial key from an interrupted start
  if ! ssh-keygen -q -t ed25519 -N "" -f "$key"; then
    echo "scalingrun-entrypoint: cannot write the ssh host key $key as uid $(id -u): run as uid 1000" \
         "(mpiuser) so that sshd can start" >&2
  fi
fi
exec "$@"
