"""What every runtime's node shares: how long stopping a node may take.

The interface a runtime implements is `launcher.planning.plan.NodeRuntime` (planning depends on it alone); `native`
(torchrun on the host) and `docker` (a container of the trainer image) are its modules here.
"""

# `docker stop -t`: how long a container's processes get between SIGTERM and SIGKILL.
STOP_GRACE_SECONDS = 20
# How long stopping a docker node waits for its wrapper before killing it: the container's grace plus time for
# `docker stop` to return and `docker wait` / `docker rm` to run, so the container never outlives `ddpctl down`.
# The longest grace any runtime's node records, so stopping a node of any runtime waits at most this long.
NODE_STOP_GRACE_SECONDS = STOP_GRACE_SECONDS + 15
