#!/usr/bin/env bash
# Debian packages the test servers need, installed only when missing (CI runs as root).
set -euo pipefail
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
LIST
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
