#!/usr/bin/env bash
# Build the offline CPU base image for tests and CI: a Debian bookworm root file system (Debian's packages, no
# container registry needed) with a venv holding the CPU torch, numpy and the trainer's other packages
# (tensorboard: its event files), imported into the local Docker engine.
# The real Dockerfile then builds on it: `--build-arg BASE_IMAGE=$(bash infra/base_image.sh)`.
#
# Prints the image tag (the only thing on stdout) and exits 0. The tag carries a hash of this script and the
# versions it installs, so a second run finds the image and returns at once.
#
#   bash infra/base_image.sh --wheels-only    # only download the wheels it needs into its wheel cache
#   bash infra/base_image.sh --tag            # only print the tag it builds (built or not)
#
# The wheels come from a cache folder (DDPCTL_CACHE_DIR, default ~/.cache/ddpctl, then base-wheels/<key>/) that
# `infra/setup.sh --test` fills with --wheels-only: set-up downloads, before the test suite cuts itself off from
# the internet (tests/conftest.py points HTTPS at a refusing proxy), so the suite builds the image without the
# network for pip. Without a complete cache it downloads them itself first, into the cache.
#
# Why not pip inside a container: the package registry's TLS chains to a CA this machine trusts but a fresh
# Debian root does not, so the wheels are downloaded here and installed offline (--no-index) in a chroot.
# The download uses the python infra/setup.sh installed into (infra/pick_python.sh): a fresh Debian's python3
# has no pip. The torch is always the CPU build (`torch==V+cpu`, from PyTorch's CPU index when it answers, else
# from pip's own configuration, e.g. a local wheel folder): the public index's plain torch is the CUDA build.
set -euo pipefail
wheels_only=false
tag_only=false
case "${1:-}" in
  "") ;;
  --wheels-only) wheels_only=true ;;
  --tag) tag_only=true ;;
  *) echo "unknown option '$1'; usage: bash infra/base_image.sh [--wheels-only | --tag]" >&2; exit 2 ;;
esac
script=$(realpath "$0")
repo=$(dirname "$(dirname "$script")")

TORCH_VERSION="${DDPCTL_TORCH_VERSION:-2.13.0}"
TORCH_VERSION="${TORCH_VERSION%%+*}"  # the base image's build is CPU whatever the version names
NUMPY_SPEC="${DDPCTL_NUMPY_SPEC:-numpy}"
# The trainer's extra beside torch and numpy (pyproject.toml's `train`): the image's trainer writes TensorBoard files.
TRAINER_SPEC="${DDPCTL_TRAINER_SPEC:-tensorboard}"
SUITE=bookworm       # its python3 is 3.11: the wheels are cp311
PY_TAG=311
PACKAGES=python3,python3-venv,ca-certificates
REPO="${DDPCTL_BASE_REPO:-ddpctl-base}"

log() { echo "base image: $*" >&2; }

# The wheels: the same for every version of this script, so the cache key names only what decides them.
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any)
wheel_key=$(echo "torch==$TORCH_VERSION+cpu $NUMPY_SPEC $TRAINER_SPEC cp$PY_TAG ${PLATFORMS[*]}" | sha256sum | cut -c1-12)
wheel_cache="${DDPCTL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpctl}/base-wheels/$wheel_key"

# Fills $wheel_cache (complete once its file `complete` exists: the download goes to a folder beside it first).
download_wheels() {
  exec 8>"/tmp/ddpctl-base-wheels-$wheel_key.lock"  # builds and set-ups side by side: one downloads, others wait
  flock 8
  if [ -e "$wheel_cache/complete" ]; then
    log "wheels for torch $TORCH_VERSION+cpu and $NUMPY_SPEC (cp$PY_TAG) already in $wheel_cache"
    return 0
  fi
  cd "$repo"
  source infra/pick_python.sh
  "$py" -m pip --version >/dev/null 2>&1 || { log "$py has no pip: run 'bash infra/setup.sh --test' first"; return 1; }
  mapfile -t cpu_choice < <(python3 infra/torch_choice.py --torch cpu --version "$TORCH_VERSION" --python-tag "cp$PY_TAG")
  local index_args=() platform_args=() partial
  if [ -n "${cpu_choice[1]:-}" ]; then index_args=(--extra-index-url "${cpu_choice[1]}"); fi
  for platform in "${PLATFORMS[@]}"; do platform_args+=(--platform "$platform"); done
  mkdir -p "$(dirname "$wheel_cache")"
  partial=$(mktemp -d "$wheel_cache.partial.XXXXXX")
  log "downloading the CPU torch $TORCH_VERSION and $NUMPY_SPEC wheels (cp$PY_TAG) ${cpu_choice[1]:+from ${cpu_choice[1]} }with $py into $wheel_cache"
  if ! "$py" -m pip download -q --disable-pip-version-check -d "$partial" "${index_args[@]}" \
    --only-binary=:all: --python-version "$PY_TAG" --implementation cp --abi "cp$PY_TAG" "${platform_args[@]}" \
    "torch==$TORCH_VERSION+cpu" "$NUMPY_SPEC" $TRAINER_SPEC >&2; then
    rm -rf "$partial"
    log "no CPU build of torch $TORCH_VERSION (torch==$TORCH_VERSION+cpu) could be downloaded: ${cpu_choice[2]:-}; put its wheel in a folder pip's find-links names, or let PyTorch's CPU index be reached (\`bash infra/setup.sh --test\` downloads it before the test suite cuts itself off from the internet)"
    return 1
  fi
  ls "$partial"/torch-* >/dev/null 2>&1 || { rm -rf "$partial"; log "pip download produced no torch wheel"; return 1; }
  touch "$partial/complete"
  rm -rf "$wheel_cache"
  mv "$partial" "$wheel_cache"
  log "downloaded $(ls "$wheel_cache" | grep -c '\.whl$') wheels into $wheel_cache"
}

if $wheels_only; then
  download_wheels
  exit
fi

hash=$( { cat "$script"; echo "$TORCH_VERSION $NUMPY_SPEC $TRAINER_SPEC $SUITE $PACKAGES"; } | sha256sum | cut -c1-12)
tag="$REPO:cpu-$hash"
if $tag_only; then
  echo "$tag"
  exit 0
fi

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

download_wheels
cp -r "$wheel_cache" "$work/wheels"
rm -f "$work/wheels/complete"

# Docs, man pages and translations are useless in a test image and cost tens of MB; so are torch's C++ headers
# (include/, for building C++ extensions) and its C++ test programs (test/, bin/ but torch_shm_manager, which
# torch.multiprocessing uses): 195 MB of the image's 1.2 GB, which every build imports and every Docker test on
# SSH hosts compresses, sends and loads. The pip in the chroot gets a clean environment: this machine's PIP_*
# settings point at paths that exist only here.
# Debian's archive keys (debian-archive-keyring, installed by setup): apt trusts the host's own archive's keys by
# default, which on a host that is not Debian (Ubuntu) cannot check Debian's archive.
keyring=()
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
log "building the $SUITE root file system with mmdebstrap"
mmdebstrap --quiet --variant=minbase --include="$PACKAGES" --aptopt='APT::Install-Recommends "false"' "${keyring[@]}" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook="cp -r '$work/wheels' \"\$1/tmp/wheels\"" \
  --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
  --customize-hook="chroot \"\$1\" env -i PATH=/usr/bin:/bin /opt/venv/bin/pip install -q --no-cache-dir --no-index --find-links /tmp/wheels \
      'torch==$TORCH_VERSION+cpu' '$NUMPY_SPEC' $TRAINER_SPEC" \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/var/lib/apt/lists/"* "$1/var/cache/apt/"*' \
  --customize-hook='cd "$1"/opt/venv/lib/python3*/site-packages/torch && rm -rf test include \
      && find bin -maxdepth 1 -type f ! -name torch_shm_manager -delete' \
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
