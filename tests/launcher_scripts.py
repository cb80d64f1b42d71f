"""The write-ups' own script shapes for `--launcher` tests, written out as the write-ups write them.

- SPAWN_LOCALHOST: write-ups 2 and 4: `mp.spawn`, MASTER_ADDR=localhost and MASTER_PORT=12355 set in the script,
  `world_size = 2` fixed, run as `python script.py`.
- SPAWN_DDPCTL: the same shape for several nodes, its place taken from ddpctl's DDPCTL_* variables.
- SPAWN_HIDDEN_LOCALHOST: SPAWN_LOCALHOST with the process group set up in a module it imports (what a static
  look at the script cannot see).
- PARALLEL_SGD: write-up 5's mpi4py parallel SGD: bcast of the weights, scatter of the data, gather of the
  local weights, averaged on rank 0.
Each training script trains a small linear model for real and prints `rank R/W step S loss L` and `rank R done`.
Each frees its DDP model before it tears the process group down, as scripts must on torch 2.13 with gloo (else
torch aborts some of them as they exit, launcher/execute/failures/hints.py's exit_abort_hint).
"""

from __future__ import annotations

from pathlib import Path

_TRAIN = '''
import gc
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(rank, world_size):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    for step in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 5 == 0 or step == 19:
            print(f"rank {rank}/{world_size} step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        out = os.environ.get("DDPCTL_OUTPUT_DIR", ".")
        torch.save(model.module.state_dict(), os.path.join(out, "model.pt"))
    print(f"rank {rank} done", flush=True)
    dist.barrier()  # as tutorials advise before tearing down: no rank leaves while another still talks to it
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive as the interpreter ends aborts it (SIGABRT)
'''

SPAWN_LOCALHOST = _TRAIN + '''

def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def main(rank, world_size):
    setup(rank, world_size)
    train(rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    mp.spawn(main, args=(world_size,), nprocs=world_size, join=True)
'''

SPAWN_DDPCTL = _TRAIN + '''

def main(local_rank, node_rank, nproc, world_size):
    rank = node_rank * nproc + local_rank
    os.environ["MASTER_ADDR"] = os.environ["DDPCTL_MASTER_ADDR"]
    os.environ["MASTER_PORT"] = os.environ["DDPCTL_MASTER_PORT"]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    train(rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    node_rank = int(os.environ["DDPCTL_NODE_RANK"])
    nproc = int(os.environ["DDPCTL_NPROC_PER_NODE"])
    world_size = int(os.environ["DDPCTL_NNODES"]) * nproc
    mp.spawn(main, args=(node_rank, nproc, world_size), nprocs=nproc, join=True)
'''

DIST_SETUP_MODULE = '''
import os
import torch.distributed as dist


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
'''

SPAWN_HIDDEN_LOCALHOST = _TRAIN + '''
from dist_setup import setup


def main(rank, world_size):
    setup(rank, world_size)
    train(rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2, join=True)
'''

PARALLEL_SGD = '''
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(0)
if rank == 0:
    x = rng.normal(size=(64 * size, 8))
    y = x.sum(axis=1)
    chunks = [(x[i::size], y[i::size]) for i in range(size)]
    w = np.zeros(8)
else:
    chunks, w = None, None
w = comm.bcast(w, root=0)
xs, ys = comm.scatter(chunks, root=0)
for epoch in range(3):
    for step in range(20):
        grad = 2 * xs.T @ (xs @ w - ys) / len(ys)
        w = w - 0.05 * grad
    loss = float(np.mean((xs @ w - ys) ** 2))
    print(f"rank {rank}/{size} epoch {epoch + 1}/3 loss {loss:.4f}", flush=True)
    weights = comm.gather(w, root=0)
    if rank == 0:
        w = np.mean(weights, axis=0)
    w = comm.bcast(w, root=0)
print(f"rank {rank} done", flush=True)
'''


def write_scripts(folder: Path) -> Path:
    """Write every script into `folder` (a project folder to run ddpctl in); return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("spawn_localhost.py", SPAWN_LOCALHOST), ("spawn_ddpctl.py", SPAWN_DDPCTL),
                       ("dist_setup.py", DIST_SETUP_MODULE), ("spawn_hidden.py", SPAWN_HIDDEN_LOCALHOST),
                       ("parallel_sgd.py", PARALLEL_SGD)):
        (folder / name).write_text(text)
    return folder
