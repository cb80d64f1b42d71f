#!/usr/bin/env bash
# Install Compose v2 (`docker compose`, what users have) beside Debian bookworm's docker-compose 1.29, so the
# tests run compose.yaml under both. Bookworm has no Compose v2 and Docker's own repository is out of reach here,
# so this takes Debian trixie's docker-compose package (2.26, a static Go binary whose only need is libc6 >= 2.34),
# fetched by apt from a private source list (apt checks Debian's signatures as always), and unpacks just its
# CLI plugin: the system's package database and sources stay bookworm's. Needs root. Does nothing when a
# `docker compose` already works.
set -euo pipefail

if docker compose version >/dev/null 2>&1; then
  exit 0
fi
# Ubuntu (24.04 and later) packages Compose v2 itself.
candidate=$(apt-cache policy docker-compose-v2 2>/dev/null | sed -n 's/^ *Candidate: //p')  # all read: no SIGPIPE
if [ -n "$candidate" ] && [ "$candidate" != "(none)" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-compose-v2 >/dev/null
  echo "Compose v2 installed: $(docker compose version)"
  exit 0
fi
plugin_dir=/usr/libexec/docker/cli-plugins
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs" "$work/root"
echo "deb http://deb.debian.org/debian trixie main" >"$work/sources.list"
apt_opts=(-q -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$work/debs" && apt-get "${apt_opts[@]}" download docker-compose >/dev/null)
dpkg-deb -x "$work"/debs/docker-compose_*.deb "$work/root"
install -D -m 0755 "$work/root$plugin_dir/docker-compose" "$plugin_dir/docker-compose"
echo "Compose v2 installed: $(docker compose version)"
