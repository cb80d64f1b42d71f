# shellcheck shell=sh
# Runs on a Slurm login node for `status` and `up --stall-timeout` (launcher/places/slurm/node_progress.py): each
# node's exit status, its attempts (the newest tells the restarts) and progress record, from the shared file
# system. $1 the run's folder, $2 nodes. Prints `NODE k|EXIT|ATTEMPTS` (EXIT empty while it runs; ATTEMPTS the suffixes of its
# attempt folders, space-separated, none before its workers start) then the progress record, per node.
k=0
while [ "$k" -lt "$2" ]; do
  ws="$1/nodes/$k"
  code=$(cat "$ws/exit_code" 2>/dev/null)
  attempts=""
  for dir in "$ws"/logs/*/attempt_*; do
    [ -d "$dir" ] && attempts="$attempts ${dir##*attempt_}"
  done
  echo "NODE $k|$code|$attempts"
  cat "$ws/out/progress.json" 2>/dev/null
  echo
  k=$((k + 1))
done
true
