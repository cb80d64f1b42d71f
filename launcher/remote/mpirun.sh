# shellcheck shell=sh
# Node 0's command for `--launcher mpirun` (launcher/spec/launchers.py), `sh -c THIS ddpctl-mpirun LOG_DIR MPIRUN
# ARGS...`: run mpirun (or a Slurm job's srun --mpi=pmix), its output into LOG_DIR/mpirun/attempt_0/0/. As root
# (mpirun refuses root without being told), it says so outright with --allow-run-as-root rather than failing on
# mpirun's banner.
logs=$1; shift
out="$logs/mpirun/attempt_0/0"
mkdir -p "$out" || exit 3
mpirun=$1; shift
# srun (a Slurm job's `srun --mpi=pmix`, launcher/places/slurm/mpi_job.py) takes no such flag.
if [ "$(id -u)" = 0 ] && [ "${mpirun##*/}" != srun ]; then set -- --allow-run-as-root "$@"; fi
"$mpirun" "$@" > "$out/stdout.log" 2> "$out/stderr.log"
code=$?
[ "$code" = 0 ] && exit 0
# Why it failed, for the failure line: the last Python traceback to its exception line (the launcher's own notes
# after it, srun's above all, would push it out of a plain tail), else the last lines.
raised=$(awk '/Traceback \(most recent call last\)/ { block = $0 "\n"; inside = 1; next }
  inside { block = block $0 "\n"; if ($0 !~ /^[ \t]/ && $0 != "") { found = block; inside = 0 } }
  END { printf "%s", found }' "$out/stderr.log")
if [ -n "$raised" ]; then printf '%s\n' "$raised" >&2; else tail -n 20 "$out/stderr.log" >&2; fi
exit "$code"
