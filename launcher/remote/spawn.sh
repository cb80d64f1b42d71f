# shellcheck shell=sh
# A `--launcher spawn` node's command (launcher/spec/launchers.py), `sh -c THIS ddpctl-spawn LOG_DIR PYTHON
# COMMAND...`: run COMMAND once, its output into LOG_DIR/spawn/attempt_0/0/ (torchrun's --log-dir layout, one
# "worker" per node). One node: MASTER_ADDR/MASTER_PORT too (a free local port picked by PYTHON unless the user's
# --env set one), which a write-up's script that reads them finds. Values arrive as arguments, never in the text.
logs=$1; py=$2; shift 2
FREE_PORT='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
out="$logs/spawn/attempt_0/0"
mkdir -p "$out" || exit 3
if [ "${DDPCTL_NNODES:-1}" = 1 ]; then
  [ -n "$MASTER_ADDR" ] || MASTER_ADDR=127.0.0.1
  [ -n "$MASTER_PORT" ] || MASTER_PORT=$("$py" -c "$FREE_PORT") || exit 3
  DDPCTL_MASTER_ADDR=$MASTER_ADDR; DDPCTL_MASTER_PORT=$MASTER_PORT
  export MASTER_ADDR MASTER_PORT DDPCTL_MASTER_ADDR DDPCTL_MASTER_PORT
fi
"$@" > "$out/stdout.log" 2> "$out/stderr.log"
code=$?
[ "$code" = 0 ] || tail -n 20 "$out/stderr.log" >&2  # the node's own output: how it ended, for the failure line
exit "$code"
