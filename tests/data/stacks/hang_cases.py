"""A small DDP script that hangs on purpose, as its argument says (collective, loader, exited): the real dumps of
tests/test_stack_verdict.py and the runs of tests/test_stack_dumps.py and tests/faults/test_hang_stacks.py."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

CASE = sys.argv[1]


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        if CASE == "loader" and dist.get_rank() == 1:
            time.sleep(3600)  # a worker stuck reading a sample
        return torch.ones(4)


def step(model, batch):
    model(batch).sum().backward()


def main():
    if os.environ["RANK"] == "0":  # a progress record (the script protocol): the run has started training
        print(json.dumps({"ddpctl": "progress", "epoch": 1, "epochs": 1, "step": 1, "steps": 8}), flush=True)
    if CASE == "exited" and os.environ["RANK"] == "1":
        sys.exit(0)  # rank 1 leaves before joining; the others wait for it
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    if CASE == "collective":
        if rank == 1:
            time.sleep(3600)  # rank 1 never reaches the all-reduce
        total = torch.ones(1)
        dist.all_reduce(total)
    elif CASE == "loader":
        for batch in DataLoader(Samples(), batch_size=8, num_workers=1):
            step(model, batch)


main()
