"""A plain torchrun DDP script that trains past a Slurm time limit: the SIGUSR1 handler of docs/guides/slurm.md
("A script of your own"). Run it with `ddpctl up --provider slurm ... --requeue -- python slurm_requeue.py`.

Slurm signals the job (SIGUSR1) a while before its limit. The handler only sets a flag; every few steps the ranks
agree (an all-reduce of the flag) so that all stop after the same step, save a checkpoint, create the requeue mark
(the file DDPCTL_REQUEUE_MARK names: "I stopped for the signal, run me again") and exit 0. The job is then requeued
and this script runs again from its start in the next allocation: it loads the checkpoint and goes on. A script
that finished its steps leaves no mark, even when the signal came as it finished, and is not run again. Without the
handler the signal is ignored and the job ends at its limit (TIMEOUT), not requeued.

Standard torchrun environment only (RANK, WORLD_SIZE, ...); DDPCTL_OUTPUT_DIR, DDPCTL_REQUEUE_FLAG and
DDPCTL_REQUEUE_MARK are read when ddpctl sets them, with plain fallbacks otherwise.
"""

import json
import os
import signal

stop = False


def on_signal(*_):
    global stop
    stop = True


# First, before the slow imports: until a handler is installed the signal is ignored (and lost).
signal.signal(signal.SIGUSR1, on_signal)
# It may have come before that (the job was slow to start): ddpctl's flag file says so.
stop = stop or os.path.exists(os.environ.get("DDPCTL_REQUEUE_FLAG", "/nonexistent"))

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-seconds", type=float, default=0.1)  # a stand-in for a real step's work
    parser.add_argument("--check-every", type=int, default=5)  # steps between the ranks' agreement on stopping
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    out = os.environ.get("DDPCTL_OUTPUT_DIR", ".")
    path = os.path.join(out, "checkpoint.pt")  # one per node: every node loads from its own disk
    step, done = 0, []
    if os.path.exists(path):
        saved = torch.load(path, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step, done = saved["step"], saved["done"]
        print(f"rank {rank}: resumed at step {step}", flush=True)
    done.append([step, None])  # this allocation's steps: [first, last + 1]
    while step < args.steps:
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_seconds)
        if step % args.check_every == 0:
            flag = torch.tensor([1.0 if stop else 0.0])
            dist.all_reduce(flag)  # every rank stops after the same step
            if flag.item() > 0:
                break
    done[-1][1] = step
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "done": done}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)  # whole or not at all
    if step < args.steps and os.environ.get("DDPCTL_REQUEUE_MARK"):  # stopped for the signal: "run me again"
        open(os.environ["DDPCTL_REQUEUE_MARK"], "a").close()  # every rank: one file, created by whoever comes first
    print(f"rank {rank}: {'finished' if step >= args.steps else 'stopped for a requeue'} at step {step}; "
          f"allocations' steps {json.dumps(done)}", flush=True)
    dist.barrier()  # no rank leaves while another still uses the group (gloo aborts a process left talking)
    dist.destroy_process_group()
    # Python puts an installed handler back to the default action while it shuts down: a signal then would end
    # the process with a status torchrun reports as a failure.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


if __name__ == "__main__":
    main()
