# shellcheck shell=sh
# On a Slurm allocation's first node, in the batch shell (launcher/places/slurm/mpi_job.py), `sh -c THIS
# ddpctl-mpi-network NODE...`: prints the IPv4 network (10.79.0.0/24) of this node's interface that holds every
# other node's address, as the node names resolve here, for Open MPI's btl/oob_tcp_if_include. Nothing where there
# is none, or no `ip`: then Open MPI chooses. A subnet, not the addresses alone: Open MPI 4.1 given one /32 per
# node includes the interfaces but its ranks still cannot reach each other.
command -v ip >/dev/null 2>&1 || exit 0
peers=""
for name in "$@"; do
  addr=$(getent ahostsv4 "$name" | awk 'NR == 1 {print $1}')
  case "$addr" in
    ""|127.*) ;;  # unresolved, or this node's own name on loopback: the other nodes decide
    *) peers="$peers $addr" ;;
  esac
done
[ -n "$peers" ] || exit 0
ip -o -4 addr show | awk -v peers="$peers" '
  function number(a,  p) { split(a, p, "."); return ((p[1] * 256 + p[2]) * 256 + p[3]) * 256 + p[4] }
  BEGIN { n = split(peers, peer, " ") }
  {
    split($4, cidr, "/"); size = 2 ^ (32 - cidr[2]); base = int(number(cidr[1]) / size) * size
    if (cidr[1] ~ /^127\./) next
    for (i = 1; i <= n; i++) if (int(number(peer[i]) / size) * size != base) next
    printf "%d.%d.%d.%d/%d\n", int(base / 16777216) % 256, int(base / 65536) % 256, int(base / 256) % 256, base % 256, cidr[2]
    exit
  }'
