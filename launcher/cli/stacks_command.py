"""`ddpctl stacks RUN`: where every rank of a live run is, one line, with the stacks kept in its run directory."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from launcher.cli.run_commands import ACCEPT, IDENTITY, RUN_ARG, RUNS_DIR, TIMEOUT, _find_run, _options
from launcher.spec.validate import check_seconds


def stacks(run: str | None = RUN_ARG, runs_dir: Path = RUNS_DIR, json_out: bool = typer.Option(False, "--json"),
           identity_file: Path | None = IDENTITY, accept_new_host_keys: bool = ACCEPT,
           connect_timeout: float = TIMEOUT) -> None:
    """Every rank's Python stack of a running run, and where each rank is (a collective, data loading, or
    elsewhere): a hang explained rank by rank."""
    from launcher.execute.live_stacks import take_recorded_stacks

    check_seconds(connect_timeout, "--connect-timeout")
    run_dir = _find_run(runs_dir, run)
    taken = take_recorded_stacks(run_dir, _options(runs_dir, identity_file, accept_new_host_keys, connect_timeout))
    if json_out:
        print(json.dumps({"run": run_dir.run_id, "verdict": taken.verdict, "stacks": str(taken.folder)}))
        return
    print(taken.verdict)
    print(f"every rank's stack: {taken.folder}")


def register(app: typer.Typer) -> None:
    app.command(name="stacks")(stacks)
