# shellcheck shell=sh
# Runs on a Slurm login node while `up` follows a job (launcher/places/slurm/rank0_output.py): global rank 0's
# own output from the shared file system.
# $1 the run's folder, $2 nodes, $3 local rank, $4 the node to read (-1: the one with progress.json, else $5),
# $6 the byte offset already shown, $7 the attempt it was in, $8 the most bytes to send. Prints
# `NODE k ATTEMPT n SIZE s START b BY rule` then the bytes from b.
node="$4" by=given
if [ "$node" -lt 0 ]; then
  node="$5" by=name
  for k in $(seq 0 $(($2 - 1))); do [ -f "$1/nodes/$k/out/progress.json" ] && node=$k by=progress && break; done
fi
ws="$1/nodes/$node"
attempt=""
for dir in "$ws"/logs/*/attempt_*; do
  n=${dir##*attempt_}
  case "$n" in ''|*[!0-9]*) continue ;; esac
  { [ -z "$attempt" ] || [ "$n" -gt "$attempt" ]; } && attempt=$n
done
[ -n "$attempt" ] || { echo "NODE $node ATTEMPT - SIZE 0 START 0 BY $by"; exit 0; }
file="" size=0
for log in "$ws"/logs/*/attempt_"$attempt"/"$3"/stdout.log; do [ -f "$log" ] && file=$log && break; done
[ -n "$file" ] && size=$(wc -c < "$file")
start="$6"
[ "$attempt" = "$7" ] && [ "$start" -le "$size" ] || start=0
[ $((size - start)) -le "$8" ] || start=$((size - $8))
echo "NODE $node ATTEMPT $attempt SIZE $size START $start BY $by"
[ "$size" -gt "$start" ] && tail -c +$((start + 1)) "$file" | head -c $((size - start))
true
