#!/usr/bin/env bash
# The README's two commands on a machine that has never seen this project, run by hand (not in CI: it needs
# Debian's archive and the package index, and takes a while).
#
#   sudo bash infra/fresh_check.sh [--host-ca|--no-host-ca] [--pytorch-index-standin] [--keep]
#
# Builds a fresh Debian bookworm root with mmdebstrap (minimal: python3, git, ca-certificates; no pip, none of
# this machine's pip configuration, no local wheel folder), clones this checkout's HEAD into it, and runs the
# README's two commands there exactly as written, each timed, in a privileged container of that root (it gets
# its own network, mount and process namespaces, so its Docker engine, test hosts and iptables rules stay apart
# from this machine's; /var/lib/docker and /tmp are directories of the work folder, since a Docker engine and
# its overlay mounts cannot live on the container's own overlay file system). Prints each command's exit
# status and time. On exit (even Ctrl-C) the container, its image and the work folder are removed and nothing
# stays mounted, unless --keep.
#
# --host-ca (the default): the fresh root also trusts this machine's CA bundle. Where the package index is
#   reached through a TLS-intercepting gateway (these machines), a fresh root cannot use pip without it.
# --pytorch-index-standin: where PyTorch's own wheel index cannot be reached (these machines), serve this
#   machine's CPU torch wheel (PIP_FIND_LINKS or /opt/wheels) as a stand-in for its CPU index, as set-up would
#   find PyTorch's index on a machine with internet; without it set-up falls back to what pip resolves from the
#   public index: the CUDA build, about 4.7 GB.
set -euo pipefail

host_ca=true
standin=false
keep=false
for arg in "$@"; do
  case "$arg" in
    --host-ca) host_ca=true ;;
    --no-host-ca) host_ca=false ;;
    --pytorch-index-standin) standin=true ;;
    --keep) keep=true ;;
    *) echo "unknown option '$arg'; usage: bash infra/fresh_check.sh [--no-host-ca] [--pytorch-index-standin] [--keep]" >&2
       exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "fresh_check.sh needs root (mmdebstrap, a privileged container): run it with sudo" >&2; exit 2; }
for tool in mmdebstrap docker git python3; do
  command -v "$tool" >/dev/null || { echo "fresh_check.sh needs $tool: run 'bash infra/setup.sh --test'" >&2; exit 2; }
done

repo=$(cd "$(dirname "$0")/.." && pwd)
# The README's two commands, exactly as it gives them (checked, so that this script tests what users read).
COMMAND_1='bash infra/setup.sh && ddpctl up --epochs 3'
COMMAND_2='bash infra/test.sh'
for command in "$COMMAND_1" "$COMMAND_2"; do
  grep -qxF "$command" "$repo/README.md" || { echo "README.md no longer gives '$command': update fresh_check.sh" >&2; exit 2; }
done

work=$(mktemp -d /var/tmp/ddpctl-fresh.XXXXXX)
name="ddpctl-fresh-$$"
image="ddpctl-fresh:$$"
server_pid=""
cleanup() {
  status=$?
  trap - EXIT INT TERM  # once, whichever of them came first
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if ! $keep; then
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker image rm "$image" >/dev/null 2>&1 || true
    # The container's mounts went with it; anything mounted below the work folder by other means goes now.
    grep -F " $work" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
    rm -rf "$work"
    left=$(grep -cF " $work" /proc/mounts || true)
    echo "fresh check: cleaned up; mounts left below $work: ${left:-0}"
  else
    echo "fresh check: kept container $name, image $image and $work"
  fi
  exit "$status"
}
trap cleanup EXIT INT TERM

say() { echo "fresh check: $*"; }
say "checkout $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" log -1 --format=%s | cut -c1-80))"
say "work folder $work"

start=$SECONDS
mmdebstrap --quiet --variant=minbase --include=python3,git,ca-certificates bookworm "$work/rootfs.tar"
say "built the Debian bookworm root in $((SECONDS - start)) s ($(du -m "$work/rootfs.tar" | cut -f1) MB)"
docker import --change 'ENV LANG=C.UTF-8' --change 'WORKDIR /root' "$work/rootfs.tar" "$image" >/dev/null
rm "$work/rootfs.tar"

git -C "$repo" bundle create "$work/project.bundle" HEAD >/dev/null 2>&1
mkdir -p "$work/docker" "$work/tmp" "$work/certs"
chmod 1777 "$work/tmp"
env_args=()
if $host_ca; then
  # One certificate a file, as update-ca-certificates wants them: it keeps them through later package installs.
  awk -v dir="$work/certs" '/BEGIN CERTIFICATE/ {n++} n {print > (dir "/host-" n ".crt")}' /etc/ssl/certs/ca-certificates.crt
fi
if $standin; then
  wheel=$(ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-*+cpu-cp311-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "no CPU torch wheel for cp311 in ${PIP_FIND_LINKS:-/opt/wheels}" >&2; exit 2; }
  mkdir -p "$work/index/whl/cpu/torch"
  cp "$wheel" "$work/index/whl/cpu/torch/"
  file=$(basename "$wheel")
  echo "<html><body><a href=\"${file/+/%2B}\">$file</a></body></html>" >"$work/index/whl/cpu/torch/index.html"
  gateway=$(docker network inspect bridge --format '{{(index .IPAM.Config 0).Gateway}}')
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
  python3 -m http.server --bind "$gateway" --directory "$work/index" "$port" >"$work/index.log" 2>&1 &
  server_pid=$!
  # Plain HTTP: pip must be told to trust this one host (the stand-in only, not set-up's business).
  env_args=(-e "DDPCTL_PYTORCH_INDEX=http://$gateway:$port/whl" -e "PIP_TRUSTED_HOST=$gateway:$port")
  say "stand-in for PyTorch's CPU index: http://$gateway:$port/whl/cpu (serving $file)"
fi

cat >"$work/inside.sh" <<'EOF'
set -uo pipefail
if ls /certs/*.crt >/dev/null 2>&1; then
  cp /certs/*.crt /usr/local/share/ca-certificates/ && update-ca-certificates >/dev/null
fi
git -c advice.detachedHead=false clone -q /work/project.bundle /root/ddpctl && cd /root/ddpctl
echo "fresh check: in the fresh root: $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version), pip: $(python3 -m pip --version 2>&1 | head -1)"
echo "fresh check: what set-up's torch choice says here: $(python3 infra/torch_choice.py | tail -1)"
results=()
for command in "$COMMAND_1" "$COMMAND_2"; do
  echo "fresh check: ===== $command"
  begin=$SECONDS
  bash -c "$command"
  status=$?
  results+=("exit $status after $((SECONDS - begin)) s: $command")
  echo "fresh check: ===== exit $status after $((SECONDS - begin)) s: $command"
done
printf 'fresh check: RESULT %s\n' "${results[@]}"
du -sh /root/ddpctl/.venv 2>/dev/null | sed 's/^/fresh check: set-up environment size /'
EOF
say "running the README's two commands in the fresh root"
docker run --name "$name" --privileged --shm-size 2g \
  -v "$work/docker:/var/lib/docker" -v "$work/tmp:/tmp" -v "$work/certs:/certs:ro" \
  -v "$work/project.bundle:/work/project.bundle:ro" -v "$work/inside.sh:/work/inside.sh:ro" \
  -e "COMMAND_1=$COMMAND_1" -e "COMMAND_2=$COMMAND_2" "${env_args[@]}" \
  "$image" bash /work/inside.sh
say "done in $((SECONDS - start)) s"
