"""A run on hosts over SSH (one torchrun node per host), and what it needs there: the network measured, MPI's logins,
the nodes stopped."""
