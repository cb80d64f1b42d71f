# shellcheck shell=sh
# Runs on a Slurm login node for `status` of a recorded run (launcher/execute/scheduled_reattach.py): each node's exit
# status, its newest attempt (restarts) and progress record, from the shared file system. $1 the run's folder,
# $2 nodes. Prints `NODE k|EXIT|ATTEMPT` (empty where not written yet) then the progress record, per node.
k=0
while [ "$k" -lt "$2" ]; do
  ws="$1/nodes/$k"
  code=$(cat "$ws/exit_code" 2>/dev/null)
  attempt=""
  for dir in "$ws"/logs/*/attempt_*; do
    n=${dir##*attempt_}
    case "$n" in ''|*[!0-9]*) continue ;; esac
    { [ -z "$attempt" ] || [ "$n" -gt "$attempt" ]; } && attempt=$n
  done
  echo "NODE $k|$code|$attempt"
  cat "$ws/out/progress.json" 2>/dev/null
  echo
  k=$((k + 1))
done
true
