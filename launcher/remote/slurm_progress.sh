# shellcheck shell=sh
# Runs on a Slurm login node while `up` follows a job (launcher/places/slurm/up.py): every node's newest progress
# record from the shared file system. $1 the run's folder. Prints `NODE <path>` then the record, for each node that
# has written one.
for f in "$1"/nodes/*/out/progress.json; do
  [ -f "$f" ] && echo "NODE $f" && cat "$f" && echo
done
true
