"""CPU of one state poll on a host: the node program (launcher/runtimes/native.py's node_program) run as a host runs
it each second for each node, `python -S -c STDIN_LOADER REQUEST` with the program on standard input, against a
workspace laid out like a node's mid-run. This checkout and, with --baseline, another one, alternating in rounds on
the same interpreter, each with a home of its own (where the host keeps what it compiled: the first poll of a round
is left out, as on a host after a run's first second). Prints the median CPU milliseconds per poll (user + system
of the polls, from RUSAGE_CHILDREN) and each round's figure. Then, where the checkout has it, the served node
program a followed run polls (`--serve`, launcher/runtimes/served_polls.py): one process answering every poll on
its standard input, its CPU per poll read from /proc/PID/schedstat (the first answer left out). Neither figure
counts the host's sshd, which a one-shot poll also costs (a session, a shell) and a served poll does not.

Usage: python bench/bench_node_poll.py [--python PYTHON] [--polls 50] [--rounds 5] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
_PROGRAM = ("import base64, json; from launcher.remote.program import on_stdin; "
            "from launcher.runtimes.native import node_program; loader, text = on_stdin(node_program()); "
            "print(json.dumps([loader, base64.b64encode(text).decode()]))")
_SERVED = ("import base64, json; from launcher.remote.program import ahead_of_input; "
           "from launcher.runtimes.native import node_program; loader, text = ahead_of_input(node_program()); "
           "print(json.dumps([loader, base64.b64encode(text).decode()]))")


def poll_of(checkout: Path, program: str = _PROGRAM) -> tuple[list[str], bytes] | None:
    """The checkout's poll: python's arguments before the request, and the standard input (None: the checkout
    has no such program)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", program], cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    loader, text = json.loads(done.stdout)
    return loader, base64.b64decode(text)


def _request(ws: Path) -> str:
    return json.dumps({"workspace": str(ws), "output": {"local_rank": 0, "attempt": 0, "offset": 0,
                                                        "max_bytes": 65536, "stream": "stdout"}})


def node_workspace(root: Path) -> Path:
    """A node mid-run: its pid (this process), torchrun's worker logs of attempt 0, progress, no failure."""
    ws = root / "ws"
    worker = ws / "logs" / "run" / "attempt_0" / "0"
    worker.mkdir(parents=True)
    (ws / "out").mkdir()
    (worker / "stdout.log").write_text("".join(f"epoch 1 step {i} loss 0.5\n" for i in range(200)))
    (worker / "stderr.log").write_text("")
    (ws / "torchrun.out").write_text("starting\n")
    (ws / "out" / "progress.json").write_text(json.dumps({"epoch": 1, "step": 200, "time": time.time()}))
    (ws / "pid").write_text(f"{os.getpid()}\n")
    return ws


def cpu_ms_per_poll(python: str, poll: tuple[list[str], bytes], ws: Path, home: Path, polls: int) -> float:
    loader, text = poll
    request = _request(ws)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(home)}
    argv = [python, "-S", *loader, request]
    subprocess.run(argv, input=text, env=env, capture_output=True, check=True)  # the first: compiles (and keeps)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(polls):
        done = subprocess.run(argv, input=text, env=env, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert json.loads(done.stdout)["attempt"] == 0, done.stdout
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / polls * 1000


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def served_cpu_ms_per_poll(python: str, served: tuple[list[str], bytes], ws: Path, home: Path, polls: int) -> float:
    """One served node program, `polls` requests after a first one: its CPU per answer."""
    loader, first = served
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(home)}
    proc = subprocess.Popen([python, "-S", *loader, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env)
    assert proc.stdin is not None and proc.stdout is not None
    line = _request(ws).encode() + b"\n"
    proc.stdin.write(first + line)
    proc.stdin.flush()
    proc.stdout.readline()
    before = _cpu_ns(proc.pid)
    for _ in range(polls):
        proc.stdin.write(line)
        proc.stdin.flush()
        answer = proc.stdout.readline()
    used = _cpu_ns(proc.pid) - before
    proc.stdin.close()
    proc.wait()
    assert json.loads(answer)["attempt"] == 0, answer
    return used / polls / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the host's interpreter (default: this one)")
    parser.add_argument("--polls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured in the same rounds")
    args = parser.parse_args()
    checkouts = {"ddpctl": CHECKOUT, **({f"baseline {args.baseline.name}": args.baseline.resolve()}
                                         if args.baseline else {})}
    polls = {name: poll for name, path in checkouts.items() if (poll := poll_of(path)) is not None}
    served = {f"{name}, served": poll for name, path in checkouts.items()
              if (poll := poll_of(path, _SERVED)) is not None}
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.python}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}; "
          f"{args.rounds} round(s) of {args.polls} polls, medians shown")
    figures: dict[str, list[float]] = {name: [] for name in [*polls, *served]}
    with tempfile.TemporaryDirectory() as tmp:
        ws = node_workspace(Path(tmp))
        for _ in range(args.rounds):  # alternating, so each sees the same load
            for name in figures:
                home = Path(tempfile.mkdtemp(dir=tmp))
                (home / ".ddpctl").mkdir()  # as on a host where the run was shipped
                figures[name].append(cpu_ms_per_poll(args.python, polls[name], ws, home, args.polls)
                                     if name in polls else
                                     served_cpu_ms_per_poll(args.python, served[name], ws, home, args.polls))
    for name, each in figures.items():
        print(f"{name}: {statistics.median(each):.2f} ms of CPU per poll "
              f"(rounds: {' '.join(f'{x:.2f}' for x in each)})")
    print(f"# load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
