#!/usr/bin/env bash
# Build the offline CPU base image for tests and CI: a Debian bookworm root file system (Debian's packages, no
# container registry needed) with a venv holding the CPU torch and numpy, imported into the local Docker engine.
# The real Dockerfile then builds on it: `--build-arg BASE_IMAGE=$(bash infra/base_image.sh)`.
#
# Prints the image tag (the only thing on stdout) and exits 0. The tag carries a hash of this script and the
# versions it installs, so a second run finds the image and returns at once.
#
# Why not pip inside a container: the package registry's TLS chains to a CA this machine trusts but a fresh
# Debian root does not, so the wheels are downloaded here and installed offline (--no-index) in a chroot.
# The download uses the python infra/setup.sh installed into (infra/pick_python.sh): a fresh Debian's python3
# has no pip. The torch is always the CPU build (`torch==V+cpu`, from PyTorch's CPU index when it answers, else
# from pip's own configuration, e.g. a local wheel folder): the public index's plain torch is the CUDA build.
set -euo pipefail
script=$(realpath "$0")
repo=$(dirname "$(dirname "$script")")

TORCH_VERSION="${DDPCTL_TORCH_VERSION:-2.13.0}"
TORCH_VERSION="${TORCH_VERSION%%+*}"  # the base image's build is CPU whatever the version names
NUMPY_SPEC="${DDPCTL_NUMPY_SPEC:-numpy}"
SUITE=bookworm       # its python3 is 3.11: the wheels are cp311
PY_TAG=311
PACKAGES=python3,python3-venv,ca-certificates
REPO="${DDPCTL_BASE_REPO:-ddpctl-base}"

log() { echo "base image: $*" >&2; }

hash=$( { cat "$script"; echo "$TORCH_VERSION $NUMPY_SPEC $SUITE $PACKAGES"; } | sha256sum | cut -c1-12)
tag="$REPO:cpu-$hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag already built"
  echo "$tag"
  exit 0
fi

# Test runs started side by side build it once: the others wait here, then find it.
exec 9>"/tmp/ddpctl-base-$hash.lock"
flock 9
if docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag already built"
  echo "$tag"
  exit 0
fi

for tool in docker mmdebstrap; do
  command -v "$tool" >/dev/null || { log "$tool is missing: run 'bash infra/setup.sh --test'"; exit 1; }
done

work=$(mktemp -d /tmp/ddpctl-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

cd "$repo"
source infra/pick_python.sh
"$py" -m pip --version >/dev/null 2>&1 || { log "$py has no pip: run 'bash infra/setup.sh --test' first"; exit 1; }
mapfile -t cpu_choice < <(python3 infra/torch_choice.py --torch cpu --version "$TORCH_VERSION" --python-tag "cp$PY_TAG")
index_args=()
if [ -n "${cpu_choice[1]:-}" ]; then index_args=(--extra-index-url "${cpu_choice[1]}"); fi
log "downloading the CPU torch $TORCH_VERSION and $NUMPY_SPEC wheels (cp$PY_TAG) ${cpu_choice[1]:+from ${cpu_choice[1]} }with $py"
if ! "$py" -m pip download -q --disable-pip-version-check -d "$work/wheels" "${index_args[@]}" \
  --only-binary=:all: --python-version "$PY_TAG" --implementation cp --abi "cp$PY_TAG" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "torch==$TORCH_VERSION+cpu" "$NUMPY_SPEC" >&2; then
  log "no CPU build of torch $TORCH_VERSION (torch==$TORCH_VERSION+cpu) could be downloaded: ${cpu_choice[2]:-}; put its wheel in a folder pip's find-links names, or let PyTorch's CPU index be reached"
  exit 1
fi
ls "$work"/wheels/torch-* >/dev/null || { log "pip download produced no torch wheel"; exit 1; }

# Docs, man pages and translations are useless in a test image and cost tens of MB. The pip in the chroot
# gets a clean environment: this machine's PIP_* settings point at paths that exist only here.
log "building the $SUITE root file system with mmdebstrap"
mmdebstrap --quiet --variant=minbase --include="$PACKAGES" --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="cp -r '$work/wheels' \"\$1/tmp/wheels\"" \
  --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
  --customize-hook="chroot \"\$1\" env -i PATH=/usr/bin:/bin /opt/venv/bin/pip install -q --no-cache-dir --no-index --find-links /tmp/wheels \
      'torch==$TORCH_VERSION+cpu' '$NUMPY_SPEC'" \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/var/lib/apt/lists/"* "$1/var/cache/apt/"*' \
  "$SUITE" "$work/rootfs.tar" >&2

log "importing into Docker as $tag"
docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.ddpctl.base.torch=$TORCH_VERSION org.ddpctl.base.hash=$hash" \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$tag" >&2
# Builds of older versions of this script are superseded; an image still in use only loses its tag. Only those
# a week old: other checkouts on this machine (other branches) may be using theirs right now.
docker image ls --filter until=168h --format '{{.Repository}}:{{.Tag}}' "$REPO" | grep -vxF "$tag" \
  | xargs -r docker image rm >&2 || true
docker run --rm "$tag" python -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" >&2
log "built $tag in $((SECONDS - start)) s"
echo "$tag"
