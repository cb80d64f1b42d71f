#!/usr/bin/env bash
# Start a Docker engine when none answers (these machines have no systemd), and wait until it does.
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
mkdir -p /var/log
nohup dockerd >/var/log/ddpctl-dockerd.log 2>&1 &
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then echo "dockerd started"; exit 0; fi
  sleep 1
done
echo "dockerd did not start within 60 s; see /var/log/ddpctl-dockerd.log" >&2
exit 1
