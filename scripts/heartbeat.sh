#!/usr/bin/env bash
# Usage: heartbeat.sh LABEL COMMAND...
# Runs COMMAND and prints "... LABEL: still running (N s)" to stderr every HEARTBEAT_S seconds
# (default 30) until it ends, so a long build never looks hung in a log; exits with its status.
set -uo pipefail
label=$1
shift
interval=${HEARTBEAT_S:-30}
start=$SECONDS
"$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid"; exit 130' INT TERM
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq 1 "$interval"); do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "... $label: still running ($((SECONDS - start)) s)" >&2
  fi
done
wait "$pid"
