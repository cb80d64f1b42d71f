#!/usr/bin/env bash
# Set up ddpctl on this machine: the CPU torch (pinned, so pip never pulls the multi-GB CUDA build), then ddpctl
# with its training extra. `infra/setup.sh --test` also installs what the test suite needs: OpenSSH (test hosts),
# iproute2/iptables (network namespaces), Docker's engine, docker-compose 1.29 and Compose v2 (infra/compose_v2.sh),
# mmdebstrap (offline base image),
# docker-registry (a local registry for `ddpctl image push` tests).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ "${1:-}" = "--test" ]; then
  missing=()
  for pkg in openssh-server openssh-client iproute2 iptables procps docker.io docker-compose mmdebstrap docker-registry; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing system packages: ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
  as_root bash infra/compose_v2.sh  # `docker compose` (v2) beside Debian's docker-compose 1.29
  extras="train,dev"
else
  extras="train"
fi

source infra/pick_python.sh
if [ "$py" != python3 ] && [ ! -x "$py" ]; then
  if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
  fi
  python3 -m venv .venv
fi
"$py" -m pip install -q --disable-pip-version-check "torch==${DDPCTL_TORCH_VERSION:-2.13.0}"
"$py" -m pip install -q --disable-pip-version-check -e ".[$extras]"
if [ "$py" != python3 ]; then
  as_root ln -sf "$PWD/.venv/bin/ddpctl" /usr/local/bin/ddpctl  # on PATH without activating .venv
fi
echo "ddpctl set up: $(command -v ddpctl) (python: $("$py" -c 'import sys; print(sys.executable)'))"
