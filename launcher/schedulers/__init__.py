"""Schedulers: a different kind of "where". Instead of starting torchrun on each host, `up` hands the run to a
batch scheduler reached through a login node, which allocates the nodes and starts the job itself.

The seam is `launcher/schedulers/base.py::Scheduler` (torchx's shape: `submit_dryrun` builds the exact request
without side effects, `schedule` submits that request); `launcher/execute/scheduled.py` drives the scheduler for
`up`. Each scheduler is a folder of its own (`slurm/`): a second one (PBS, Kubernetes) is a new folder."""
