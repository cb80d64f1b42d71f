# shellcheck shell=sh
# What a Vast.ai node's autostop watchdog (launcher/remote/autostop_watchdog.py) is doing, read on the node
# (launcher/places/vast/watchdog_state.py), `sh -c THIS ddpctl-autostop WORKSPACE`: prints its state.json
# (nothing when there is none), then on its own line whether the process it names runs the watchdog of this
# workspace ("alive") or not ("dead"): a pid alone may be reused. Shell, not Python: `status` asks every node, and
# a shell starts in a fraction of the time an interpreter takes.
f="$1/.autostop/state.json"
[ -f "$f" ] || exit 0
cat "$f"; echo
pid=$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$f")
if [ -n "$pid" ] && tr '\000' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$1"; then
  echo alive
else
  echo dead
fi
