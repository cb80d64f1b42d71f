# shellcheck shell=sh
# What a host's Docker engine is, for its login user (launcher/runtimes/docker_hosts.py), `sh -c THIS
# ddpctl-docker-info IMAGE`: prints `engine RUNTIMES-JSON` or `problem TEXT`, then `image ID` and
# `digests REPO@DIGEST...` (empty when the host lacks IMAGE).
command -v docker >/dev/null 2>&1 || { echo "problem no docker command on this host"; exit 0; }
if ! out=$(docker info --format '{{json .Runtimes}}' 2>&1); then
  echo "problem $(echo "$out" | grep -v '^$' | tail -n 1)"; exit 0
fi
echo "engine $out"
echo "image $(docker image inspect --format '{{.Id}}' "$1" 2>/dev/null)"
echo "digests $(docker image inspect --format '{{join .RepoDigests " "}}' "$1" 2>/dev/null)"
