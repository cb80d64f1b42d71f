# shellcheck shell=sh
# Node k > 0's command for `--launcher mpirun` on several nodes, `sh -c THIS ddpctl-mpi-node K PROCESSES`: nothing
# to run (node 0's mpirun starts its ranks over SSH), so it says so.
echo "node $1: its $2 process(es) are started by node 0's mpirun over SSH"
