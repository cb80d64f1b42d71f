"""What a Slurm job's nodes wrote of their progress, read from the shared file system through the login node: each
node's exit status, newest attempt and progress record, and for a script rank 0's progress from the end of its
output. `status` shows it (recorded_job.py); `up --stall-timeout` watches it (job_stall.py)."""

from __future__ import annotations

import json
from typing import Any

from launcher.remote import shell_text
from launcher.results.rundir import RunDir
from launcher.transport.ssh import Connection

# Each node's exit status, newest attempt (torchrun's attempt_<N>, numbered alike on every node) and progress
# record: `NODE k|exit code|attempt` then the record (empty when none).
NODES_SCRIPT = shell_text("slurm_nodes.sh")  # launcher/remote/slurm_nodes.sh: its arguments there
# The end of the newest attempt's output of one worker: $1 the node's folder, $2 its local rank, $3 how many bytes.
RANK_TAIL = ('n=-1; f=; for d in "$1"/logs/*/attempt_*; do a=${d##*attempt_}; '
             'if [ -d "$d" ] && [ "$a" -gt "$n" ] 2>/dev/null; then n=$a; f="$d/$2/stdout.log"; fi; done; '
             'if [ -n "$f" ]; then tail -c "$3" "$f" 2>/dev/null; fi; true')


def node_states(conn: Connection, remote_dir: str,
                nodes: int) -> list[tuple[int | None, dict[str, Any], int | None]]:
    """Each node's exit status (None while it runs), progress record and restarts (its newest attempt; None before
    its workers start), read from the shared file system."""
    result = conn.run(["sh", "-c", NODES_SCRIPT, "ddpctl-nodes", remote_dir, str(nodes)], timeout=60)
    states: list[tuple[int | None, dict[str, Any], int | None]] = [(None, {}, None) for _ in range(nodes)]
    for chunk in result.stdout.split("NODE ")[1:]:
        head, _, body = chunk.partition("\n")
        index, code, attempts = (head.split("|") + ["", ""])[:3]
        numbers = [int(a) for a in attempts.split() if a.isdigit()]
        try:
            progress = json.loads(body) if body.strip() else {}
        except ValueError:
            progress = {}
        if index.isdigit() and int(index) < nodes:
            states[int(index)] = (int(code) if code.strip().lstrip("-").isdigit() else None, progress,
                                  max(numbers) if numbers else None)
    return states


def script_progress(conn: Connection, run_dir: RunDir, remote_dir: str,
                    nodes: list[tuple[int | None, dict[str, Any], int | None]]) -> list[
                        tuple[int | None, dict[str, Any], int | None]]:
    """For a script (nothing writes its progress.json): rank 0's node's progress from the end of rank 0's output."""
    from launcher.results.progress import progress_record
    from launcher.results.rank_layout import rank_layout
    from launcher.results.script_progress import SCRIPT_TAIL_BYTES, script_record

    if not run_dir.spec().user_command:
        return nodes
    node, local_rank = rank_layout(run_dir).locate(0)
    if node >= len(nodes) or nodes[node][1]:
        return nodes
    tail = conn.run(["sh", "-c", RANK_TAIL, "ddpctl-rank-tail", f"{remote_dir}/nodes/{node}", str(local_rank),
                     str(SCRIPT_TAIL_BYTES)], timeout=30).stdout
    progress = progress_record(script_record(tail, len(tail.encode()) < SCRIPT_TAIL_BYTES)) or {}
    return [(code, progress, attempt) if k == node else (code, was, attempt)
            for k, (code, was, attempt) in enumerate(nodes)]
