# shellcheck shell=sh
# Node 0's command for `--launcher mpirun` (launcher/spec/launchers.py), `sh -c THIS ddpctl-mpirun LOG_DIR MPIRUN
# ARGS...`: run mpirun, its output into LOG_DIR/mpirun/attempt_0/0/. As root (mpirun refuses root without being
# told), it says so outright with --allow-run-as-root rather than failing on mpirun's banner.
logs=$1; shift
out="$logs/mpirun/attempt_0/0"
mkdir -p "$out" || exit 3
mpirun=$1; shift
if [ "$(id -u)" = 0 ]; then set -- --allow-run-as-root "$@"; fi
"$mpirun" "$@" > "$out/stdout.log" 2> "$out/stderr.log"
code=$?
[ "$code" = 0 ] || tail -n 20 "$out/stderr.log" >&2
exit "$code"
