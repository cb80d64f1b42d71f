"""A pull that fails after the nodes have ended (sshd killed mid-pull: paramiko's "Server connection dropped: ",
with nothing after it) ends `up` with one line that says how the training ended, that the pull did not and why in
words, and the `ddpctl pull RUN` that fetches the rest later; the line is the run's recorded outcome too."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from launcher.errors import DdpctlError
from launcher.execute.following.interruption import pull_after_run, recorded_outcome
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec
from launcher.transport.parallel import raise_for_errors, run_on_hosts


def failing_pull(reasons: dict[int, Exception | None]) -> None:
    """The pull as on_hosts.pull_run runs it: one call per node, the failures raised together."""
    def pull(index: int) -> dict[str, int]:
        error = reasons[index]
        if error is not None:
            raise error
        return {"verified": 3}

    raise_for_errors(run_on_hosts(list(reasons), pull, timeout=10, label=lambda i: f"u@host{i}"), "pull")


@pytest.mark.parametrize(("codes", "ended"), [([0, 0], "the training finished on every node (exit status 0)"),
                                              ([0, 1], "the run ended on every node (exit statuses 0, 1)")])
def test_a_pull_failing_after_the_run_names_the_training_the_pull_and_how_to_fetch(
        tmp_path: Path, codes: list[int], ended: str) -> None:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="r1", nnodes=2), {"nodes": []})
    run_dir.event("finished", exit_codes=codes)
    reasons: dict[int, Exception | None] = {0: None, 1: paramiko.SSHException("Server connection dropped: ")}
    with pytest.raises(DdpctlError) as failed:
        pull_after_run(run_dir, lambda: failing_pull(reasons))
    line = str(failed.value)
    assert "\n" not in line and line.startswith(f"{ended}, but the pull did not: u@host1: ")
    assert "the SSH connection dropped (the host's sshd ended or the network failed)" in line
    assert "dropped: ;" not in line and not line.endswith(": ")
    assert f"`ddpctl pull r1` fetches what the nodes wrote into {run_dir.path}" in line
    assert recorded_outcome(run_dir.path, "") == line


def test_every_failing_host_is_named_with_its_own_reason(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path / "runs", RunSpec(run_id="r2", nnodes=3), {"nodes": []})
    reasons: dict[int, Exception | None] = {0: OSError("No route to host"), 1: None,
                                            2: paramiko.SSHException("Server connection dropped: ")}
    with pytest.raises(DdpctlError) as failed:
        pull_after_run(run_dir, lambda: failing_pull(reasons))
    line = str(failed.value)
    assert line.startswith("the run ended on every node, but the pull did not: u@host0: No route to host; u@host2: ")
