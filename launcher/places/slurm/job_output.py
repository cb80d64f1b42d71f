"""What Slurm itself says about a job, read as text (pure): the hostlist of its allocation, and the oom-kill notes
that slurmstepd writes to the job's own output (`slurm-<job>.out`) when task/cgroup's memory limit killed a process
(or, with jobacct_gather's OverMemoryKill, when it killed a step over its memory).

A process killed in an `srun` step for lack of memory leaves the job FAILED in Slurm 22.05 (the step's own state,
OUT_OF_MEMORY, is kept only by accounting); only a batch step killed so ends the job OUT_OF_MEMORY. slurmstepd's
note in the job's output names the step and the node either way, so the run's end can say which it was."""

from __future__ import annotations

import re
from dataclasses import dataclass

# jobacct_gather's OverMemoryKill (clusters without task/cgroup): the step is killed by slurmstepd itself.
_OVER_LIMIT_NOTE = re.compile(r"^slurmstepd(?:-(?P<node>[^:\s]+))?: error: StepId=(?P<step>[0-9]+\.[A-Za-z0-9_]+) "
                              r"exceeded memory limit \((?P<used>\d+) > (?P<limit>\d+)\)", re.MULTILINE)
_OOM_NOTE = re.compile(r"^slurmstepd(?:-(?P<node>[^:\s]+))?: error: Detected (?P<count>\d+) oom[-_]kill event\(s\) "
                       r"in StepId=(?P<step>[0-9]+\.[A-Za-z0-9_]+)", re.MULTILINE)
# srun's own line for a task whose exit carried the out-of-memory flag; slurmstepd's note above can be missing
# (srun may end the step's output before a remote slurmstepd's note reaches it), this line is srun's and stays.
_SRUN_OOM = re.compile(r"^srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[0-9,\-]+): Out Of Memory$", re.MULTILINE)
_SRUN_STEP = re.compile(r"^srun: .*\bStepId=(?P<step>[0-9]+\.[A-Za-z0-9_]+)", re.MULTILINE)


@dataclass(frozen=True)
class OomKill:
    """One oom-kill note: the step (`12.0`, `12.batch`), the node it happened on (None if not named), how many."""

    step: str
    node: str | None
    count: int
    over_limit: str = ""  # OverMemoryKill's "USED > LIMIT" bytes, where slurmstepd killed the step itself

    @property
    def text(self) -> str:
        where = f" on {self.node}" if self.node else ""
        step = f"Slurm step {self.step}" if self.step else "a Slurm step"
        if self.over_limit:
            return f"{step}{where} exceeded its memory limit ({self.over_limit} bytes) and was killed"
        return f"{self.count} oom-kill event(s) in {step}{where}"


def oom_kills(job_output: str) -> list[OomKill]:
    """The oom-kill notes in a job's output (and OverMemoryKill's), in the order written; srun's "Out Of Memory"
    line of a task counts where no slurmstepd note names that node."""
    found = [(m.start(), OomKill(m["step"], m["node"], int(m["count"]))) for m in _OOM_NOTE.finditer(job_output)]
    found += [(m.start(), OomKill(m["step"], m["node"], 1, f"{m['used']} > {m['limit']}"))
              for m in _OVER_LIMIT_NOTE.finditer(job_output)]
    noted = {kill.node for _, kill in found}
    for m in _SRUN_OOM.finditer(job_output):
        if m["node"] not in noted and None not in noted:
            found.append((m.start(), OomKill(_srun_step(job_output, m.end()), m["node"], _task_count(m["tasks"]))))
            noted.add(m["node"])
    return [kill for _, kill in sorted(found, key=lambda item: item[0])]


def _srun_step(job_output: str, after: int) -> str:
    """The step srun names next (`Terminating StepId=12.0`), else the one it named last; "" when it named none."""
    steps = [(m.start(), m["step"]) for m in _SRUN_STEP.finditer(job_output)]
    later = [step for at, step in steps if at >= after]
    earlier = [step for at, step in steps if at < after]
    return later[0] if later else earlier[-1] if earlier else ""


def _task_count(tasks: str) -> int:
    """How many tasks srun's task list names (`1`, `0-3`, `1,3`)."""
    count = 0
    for part in tasks.split(","):
        low, _, high = part.partition("-")
        count += int(high) - int(low) + 1 if high else 1
    return count


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list (`node[01-03,7],gpu5`) as names, in Slurm's order (that of SLURM_NODEID)."""
    names: list[str] = []
    for item in _top_level_items(hostlist.strip()):
        names += _expand_item(item)
    return names


def _top_level_items(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item and item not in ("(null)", "None")]


def _expand_item(item: str) -> list[str]:
    open_at = item.find("[")
    close_at = item.find("]", open_at)
    if open_at < 0 or close_at < 0:
        return [item]
    head, ranges, tail = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            numbers = [low]
        elif low.isdigit() and high.isdigit():
            numbers = [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
        else:
            numbers = [part]
        out += [head + number + rest for number in numbers for rest in _expand_item(tail)]
    return out
