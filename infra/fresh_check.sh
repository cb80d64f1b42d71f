#!/usr/bin/env bash
# The README's two commands on a machine that has never seen this project, run by hand (not in CI: it needs
# Debian's archive and the package index, and takes a while).
#
#   sudo bash infra/fresh_check.sh [--ubuntu] [--no-host-ca] [--pytorch-index-standin] [--keep]
#
# Builds a fresh Debian bookworm root (--ubuntu: Ubuntu 24.04 "noble", from Ubuntu's archive, checked with Ubuntu's
# archive keyring as Debian trixie packages it, ubuntu-keyring; components main, restricted, universe and
# multiverse, and apt, as an Ubuntu install has them) with mmdebstrap (minimal: python3, git, ca-certificates; no pip, none of
# this machine's pip configuration, no local wheel folder), clones this checkout's HEAD into it, and runs the
# README's two commands there exactly as written, each timed, as root in a chroot. The chroot gets namespaces of
# its own: network (a veth to this machine, NAT to the internet), so that its Docker engine, test hosts and
# iptables rules stay apart from this machine's; mount, so that /proc, /sys, /dev, /run and everything mounted
# inside go away with it; and process IDs, so that when the commands end every process started inside (dockerd,
# sshd) is killed with it. (A privileged container would do the same, but where this machine is itself a
# container with fewer capabilities, a privileged one cannot start.) Prints each command's exit status and time.
# On exit (even Ctrl-C) the namespace, its veth, NAT rules and the work folder are removed, unless --keep.
#
# --no-host-ca: do not add this machine's CA bundle to the fresh root. Where the package index is reached
#   through a TLS-intercepting gateway (these machines), a fresh root cannot use pip without it.
# --pytorch-index-standin: where PyTorch's own wheel index cannot be reached (these machines), serve this
#   machine's CPU torch wheel (PIP_FIND_LINKS or /opt/wheels) as a stand-in for its CPU index, as set-up would
#   find PyTorch's index on a machine with internet; without it set-up falls back to what pip resolves from the
#   public index: the CUDA build (2.7 GB to download, about 4.7 GB installed), and the offline Docker base image
#   of command 2 finds no CPU build.
set -euo pipefail

host_ca=true
standin=false
keep=false
ubuntu=false
for arg in "$@"; do
  case "$arg" in
    --ubuntu) ubuntu=true ;;
    --host-ca) host_ca=true ;;
    --no-host-ca) host_ca=false ;;
    --pytorch-index-standin) standin=true ;;
    --keep) keep=true ;;
    *) echo "unknown option '$arg'; usage: bash infra/fresh_check.sh [--ubuntu] [--no-host-ca] [--pytorch-index-standin] [--keep]" >&2
       exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "fresh_check.sh needs root (mmdebstrap, namespaces, chroot): run it with sudo" >&2; exit 2; }
for tool in mmdebstrap git python3 ip iptables unshare nsenter; do
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
root="$work/root"
netns="ddpfresh$$"
veth="dfr$$"  # and ${veth}c inside; interface names have at most 15 characters
subnet=""
chain=FORWARD
nat_added=false
forward_added=false
server_pid=""
cleanup() {
  status=$?
  trap - EXIT INT TERM  # once, whichever of them came first
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if $nat_added; then iptables -w -t nat -D POSTROUTING -s "$subnet.0/30" -j MASQUERADE || true; fi
  if $forward_added; then
    iptables -w -D "$chain" -i "$veth" -j ACCEPT || true
    iptables -w -D "$chain" -o "$veth" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT || true
  fi
  ip link del "$veth" 2>/dev/null || true
  # Its processes died with the chroot's PID namespace; its mounts with its mount namespace.
  ip netns del "$netns" 2>/dev/null || true
  left=$(grep -cF " $work" /proc/mounts || true)
  if [ "${left:-0}" != 0 ]; then
    echo "fresh check: unmounting $left mount(s) left below $work"
    grep -F " $work" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
  fi
  if ! $keep; then rm -rf --one-file-system "$work"; fi
  echo "fresh check: cleaned up$($keep && echo " (kept $work)"); mounts left below $work: $(grep -cF " $work" /proc/mounts || true), namespace $netns: $(ip netns list | grep -cw "$netns" || true)"
  exit "$status"
}
trap cleanup EXIT INT TERM

say() { echo "fresh check: $*"; }
say "checkout $(git -C "$repo" rev-parse --short HEAD) ($(git -C "$repo" log -1 --format=%s | cut -c1-80))"
say "work folder $work"

start=$SECONDS
if $ubuntu; then
  # Ubuntu's archive keyring, from Debian trixie's signed package (apt checks Debian's signature), unpacked here.
  mkdir -p "$work/keyring/lists/partial" "$work/keyring/debs" "$work/keyring/root"
  echo "deb http://deb.debian.org/debian trixie main" >"$work/keyring/sources.list"
  apt_opts=(-q -o "Dir::Etc::SourceList=$work/keyring/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$work/keyring/lists" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$work/keyring/debs" && apt-get "${apt_opts[@]}" download ubuntu-keyring >/dev/null)
  dpkg-deb -x "$work"/keyring/debs/ubuntu-keyring_*.deb "$work/keyring/root"
  components="main restricted universe multiverse"
  mmdebstrap --quiet --variant=minbase --include=apt,python3,git,ca-certificates --components="${components// /,}" \
    --keyring="$work/keyring/root/usr/share/keyrings/ubuntu-archive-keyring.gpg" noble "$root" \
    "deb http://archive.ubuntu.com/ubuntu noble $components" \
    "deb http://archive.ubuntu.com/ubuntu noble-updates $components" \
    "deb http://security.ubuntu.com/ubuntu noble-security $components"
  say "built the Ubuntu 24.04 (noble) root in $((SECONDS - start)) s ($(du -sm "$root" | cut -f1) MB)"
else
  mmdebstrap --quiet --variant=minbase --include=python3,git,ca-certificates bookworm "$root"
  say "built the Debian bookworm root in $((SECONDS - start)) s ($(du -sm "$root" | cut -f1) MB)"
fi

# What a Debian installer leaves and mmdebstrap does not: the host's name resolution and /etc/hosts.
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tfresh\n' >"$root/etc/hosts"
echo fresh >"$root/etc/hostname"
mkdir -p "$root/work"
git -C "$repo" bundle create "$root/work/project.bundle" HEAD 2>/dev/null
if $host_ca; then
  # One certificate a file, as update-ca-certificates wants them: they then survive later package installs.
  awk -v dir="$root/usr/local/share/ca-certificates" \
    '/BEGIN CERTIFICATE/ {n++} n {print > (dir "/host-" n ".crt")}' /etc/ssl/certs/ca-certificates.crt
fi

# The network: a namespace joined to this machine by a veth pair, NAT to the outside.
for third in $(seq 0 255); do
  candidate="10.232.$third"
  ip -o -4 addr show | grep -qF " $candidate." || { subnet=$candidate; break; }
done
[ -n "$subnet" ] || { echo "no free 10.232.x.0/30 subnet" >&2; exit 1; }
ip netns add "$netns"
ip link add "$veth" type veth peer name "${veth}c"
ip link set "${veth}c" netns "$netns"
ip addr add "$subnet.1/30" dev "$veth"
ip link set "$veth" up
ip -n "$netns" addr add "$subnet.2/30" dev "${veth}c"
ip -n "$netns" link set "${veth}c" up
ip -n "$netns" link set lo up
ip -n "$netns" route add default via "$subnet.1"
if iptables -w -S DOCKER-USER >/dev/null 2>&1; then chain=DOCKER-USER; fi  # Docker's FORWARD policy is DROP
nat_added=true
iptables -w -t nat -A POSTROUTING -s "$subnet.0/30" -j MASQUERADE
forward_added=true
iptables -w -I "$chain" -i "$veth" -j ACCEPT
iptables -w -I "$chain" -o "$veth" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
[ "$(cat /proc/sys/net/ipv4/ip_forward)" = 1 ] || { echo "IP forwarding is off here: the chroot would have no network" >&2; exit 1; }

env_args=()
if $standin; then
  wheel=$(ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-*+cpu-cp311-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "no CPU torch wheel for cp311 in ${PIP_FIND_LINKS:-/opt/wheels}" >&2; exit 2; }
  mkdir -p "$work/index/whl/cpu/torch"
  cp "$wheel" "$work/index/whl/cpu/torch/"
  file=$(basename "$wheel")
  echo "<html><body><a href=\"${file/+/%2B}\">$file</a></body></html>" >"$work/index/whl/cpu/torch/index.html"
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
  python3 -m http.server --bind "$subnet.1" --directory "$work/index" "$port" >"$work/index.log" 2>&1 &
  server_pid=$!
  # Plain HTTP: pip must be told to trust this one host (the stand-in's business, not set-up's).
  env_args=("DDPCTL_PYTORCH_INDEX=http://$subnet.1:$port/whl" "PIP_TRUSTED_HOST=$subnet.1:$port")
  say "stand-in for PyTorch's CPU index: http://$subnet.1:$port/whl/cpu (serving $file)"
fi

cat >"$root/work/inside.sh" <<'EOF'
set -uo pipefail
update-ca-certificates >/dev/null
git -c advice.detachedHead=false clone -q /work/project.bundle /root/ddpctl && cd /root/ddpctl
echo "fresh check: in the fresh root: $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version), pip: $(python3 -m pip --version 2>&1 | head -1)"
echo "fresh check: set-up's torch choice here says: $(python3 infra/torch_choice.py | tail -1)"
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

# Mounts made in a private mount namespace: they end with it. PID 1 of the new PID namespace is the shell that
# runs the commands: when it exits, the kernel kills what is left inside (dockerd, sshd...).
cat >"$work/enter.sh" <<'EOF'
set -euo pipefail
root=$1; shift
# The root a mount point of its own, as a machine's / is: Docker's engine remounts / (to make it a slave mount)
# when it unpacks images, which fails on a plain directory.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
mount -t tmpfs -o mode=755 run "$root/run"
hostname fresh
exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" bash /work/inside.sh
EOF
say "running the README's two commands in the fresh root"
nsenter --net="/run/netns/$netns" unshare --mount --propagation private --pid --fork --uts \
  bash "$work/enter.sh" "$root" "COMMAND_1=$COMMAND_1" "COMMAND_2=$COMMAND_2" "${env_args[@]}"
say "done in $((SECONDS - start)) s"
