#!/usr/bin/env bash
# Debian packages the test servers need (sshd for the SFTP tests, mmdebstrap for the HTCondor
# pool's root, Node and npm for Azurite), installed only when missing.
# Run by `make test` (CI runs as root); `make bench` does not need it. apt waits up to
# APT_LOCK_WAIT_S (default 600) for a lock another process holds instead of failing, and
# prints a line every 30 s while it works.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
need=()
# command -> package
while read -r cmd pkg; do
  [ -z "$cmd" ] && continue
  [ -x "$cmd" ] || command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done <<'LIST'
/usr/sbin/sshd openssh-server
ssh-keygen openssh-client
redis-server redis-server
redis-cli redis-tools
ip iproute2
curl curl
strace strace
mmdebstrap mmdebstrap
node nodejs
npm npm
LIST
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  wait_s=${APT_LOCK_WAIT_S:-600}
  apt=($SUDO apt-get -o "DPkg::Lock::Timeout=$wait_s" -q)
  bash "$here/heartbeat.sh" "apt-get update" "${apt[@]}" update >/dev/null
  DEBIAN_FRONTEND=noninteractive bash "$here/heartbeat.sh" "apt-get install ${need[*]}" \
    "${apt[@]}" install -y "${need[@]}" >/dev/null
fi
