# shellcheck shell=sh
# A docker node's command on its host (launcher/runtimes/docker.py), `sh -c THIS ddpctl-docker WORKSPACE DATA_DIR
# NAME GRACE ENV_FILE DOCKER-RUN-OPTIONS... IMAGE COMMAND...`: start the node's container detached, its environment
# from WORKSPACE/ENV_FILE (deleted once the container exists), follow its output, exit with its exit code and
# remove it; on TERM/INT/HUP stop it (`docker stop -t GRACE`). Relative paths are taken from $HOME.
ws=$1; data=$2; name=$3; grace=$4; envfile=$5; shift 5
case "$ws" in /*) ;; *) ws="$HOME/$ws" ;; esac
if [ -n "$data" ]; then
  case "$data" in /*) ;; *) data="$HOME/$data" ;; esac
  set -- -v "$data:/data" "$@"
fi
mkdir -p "$ws/out" "$ws/logs" || exit 125
trap 'docker stop -t "$grace" "$name" >/dev/null 2>&1' TERM INT HUP
docker rm "$name" >/dev/null 2>&1
docker run -d --name "$name" --user "$(id -u):$(id -g)" -v "$ws:/workspace" --env-file "$ws/$envfile" "$@" \
  >/dev/null
started=$?
rm -f "$ws/$envfile"
[ "$started" -eq 0 ] || exit 125
docker logs -f "$name" 2>&1 &
logs=$!
code=
while [ -z "$code" ]; do
  docker wait "$name" > "$ws/.docker-wait" 2>/dev/null &
  wait $!
  code=$(cat "$ws/.docker-wait" 2>/dev/null)
  if [ -z "$code" ] && ! docker inspect "$name" >/dev/null 2>&1; then
    echo "ddpctl: container $name is gone" >&2; code=125
  fi
done
wait "$logs" 2>/dev/null
docker rm "$name" >/dev/null 2>&1
rm -f "$ws/.docker-wait"
exit "$code"
