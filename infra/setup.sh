#!/usr/bin/env bash
# Set up ddpctl on this machine: torch (the build infra/torch_choice.py picks: the CPU build from PyTorch's CPU
# index on a machine without an NVIDIA driver, the CUDA build the driver runs otherwise; `--torch cpu|cuda` and
# DDPCTL_TORCH_VERSION override), then ddpctl with its training extra. Needs root or sudo where apt must install
# python3-venv and to link ddpctl into /usr/local/bin.
# `infra/setup.sh --test` also installs what the test suite needs: OpenSSH (test hosts),
# iproute2/iptables (network namespaces), Docker's engine, docker-compose 1.29 and Compose v2 (infra/compose_v2.sh),
# mmdebstrap and Debian's archive keyring (the offline base image, also on Ubuntu) and the wheels that image gets
# (infra/base_image.sh --wheels-only),
# docker-registry (a local registry for `ddpctl image push` tests), slurmctld, slurmd, slurm-client and munge (a
# real Slurm cluster in the test bed: infra/slurm_cluster.py), shellcheck (the shell scripts of launcher/remote/),
# libfaketime (a test host whose clock is skewed: tests/faults/test_clock_skew.py).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

usage="usage: bash infra/setup.sh [--test] [--torch auto|cpu|cuda]"
with_tests=false
torch_build=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --test) with_tests=true ;;
    --torch) [ $# -ge 2 ] || { echo "--torch needs a value: cpu, cuda or auto; $usage" >&2; exit 2; }
             torch_build=$2; shift ;;
    --torch=*) torch_build=${1#--torch=} ;;
    *) echo "unknown option '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
case "$torch_build" in
  auto|cpu|cuda) ;;
  *) echo "--torch '$torch_build' is not one of auto, cpu, cuda; $usage" >&2; exit 2 ;;
esac
apt_install() {
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

if $with_tests; then
  missing=()
  for pkg in openssh-server openssh-client iproute2 iptables procps docker.io docker-compose mmdebstrap debian-archive-keyring \
             docker-registry slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev shellcheck libfaketime; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing system packages: ${missing[*]}"
    apt_install "${missing[@]}"
  fi
  as_root bash infra/compose_v2.sh  # `docker compose` (v2) beside Debian's docker-compose 1.29
  extras="train,dev,mpi"  # mpi: mpi4py, built against the OpenMPI above (--launcher mpirun's tests)
else
  extras="train"
fi

source infra/pick_python.sh
if [ "$py" != python3 ] && [ ! -x "$py" ]; then
  if ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    apt_install python3-venv
  fi
  python3 -m venv .venv
fi
# Three lines: requirement, index URL (empty: pip's own configuration), why. Pip's progress stays visible: the
# CUDA build is several GB.
mapfile -t torch_choice < <(python3 infra/torch_choice.py --torch "$torch_build")
[ ${#torch_choice[@]} -eq 3 ] || exit 2  # torch_choice.py said what was wrong
index_args=()
# --extra-index-url: the build is pinned by its local version (+cpu, +cu126), which only that index has; torch's
# dependencies may come from either (a mirror of PyTorch's index may carry torch alone).
if [ -n "${torch_choice[1]}" ]; then index_args=(--extra-index-url "${torch_choice[1]}"); fi
echo "installing ${torch_choice[0]}${torch_choice[1]:+ from ${torch_choice[1]}}"
"$py" -m pip install --disable-pip-version-check "${index_args[@]}" "${torch_choice[0]}"
"$py" -m pip install -q --disable-pip-version-check -e ".[$extras]"
if [ "$py" != python3 ]; then
  as_root ln -sf "$PWD/.venv/bin/ddpctl" /usr/local/bin/ddpctl  # on PATH without activating .venv
fi
if $with_tests; then
  # The tests' offline Docker base image needs the CPU torch for Debian's python: downloaded now, while the
  # network is there; the test suite then cuts itself off from the internet (tests/conftest.py).
  bash infra/base_image.sh --wheels-only
fi
torch_installed=$("$py" -c 'from importlib.metadata import version; print(version("torch"))')
echo "torch $torch_installed installed: ${torch_choice[2]}"
echo "ddpctl set up: $(command -v ddpctl) (python: $("$py" -c 'import sys; print(sys.executable)'))"
