# shellcheck shell=sh
# What `--launcher mpirun` needs on a host (launcher/planning/mpi_check.py), `sh -c THIS ddpctl-mpi-check PYTHON
# MPI4PY SSH`: prints what is missing, `|`-separated (an empty line: nothing). MPI4PY 1: PYTHON must import mpi4py;
# SSH 1: an ssh client (node 0 of several). Shell, not Python: PYTHON itself may be what is missing.
py=$1; missing=""
if ! command -v mpirun >/dev/null 2>&1; then missing="$missing|openmpi (no mpirun on PATH: install openmpi-bin)"
elif ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  missing="$missing|Open MPI (the mpirun on PATH is not Open MPI's)"
fi
if [ "$2" = 1 ] && ! "$py" -c "import mpi4py" >/dev/null 2>&1; then
  missing="$missing|mpi4py ($py cannot import it: $py -m pip install mpi4py, or install python3-mpi4py)"
fi
if [ "$3" = 1 ] && ! command -v ssh >/dev/null 2>&1; then
  missing="$missing|ssh (node 0 starts the other nodes' processes over SSH: install openssh-client)"
fi
printf '%s\n' "$missing"
