"""The DDP trainer that ddpctl runs under torchrun: `python -m trainer --help`.

Modules by concept: `distributed` (torchrun's environment, process group), `data` (readers straight into
tensors), `sharding` (DistributedSampler's order on index tensors), `models`, `snapshot` (atomic, checksummed
files), `records` (timing, progress, summary), `trainer` (the Trainer), `files` (atomic writes),
`errors`, `__main__` (the command line).
"""
