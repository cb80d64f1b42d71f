"""Runs re-run from their record: `ddpctl up --from runs/<id>` (a local run and a test-bed run: same spec, hosts,
trainer argv; on CPU with the same seed the same final weights). (`sweep` with up's launch options on the bed is
tests/test_sweep.py's, on that module's sweep over the bed.)"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import app as cli
from launcher.planning.request import UpResult
from launcher.results.rundir import RunDir
from tests.cli_runner import ddpctl
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, run_ddpctl

REPO = Path(__file__).resolve().parent.parent
TINY = ["--epochs", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64"]


def run_dir_of(result: subprocess.CompletedProcess[str]) -> Path:
    assert result.returncode == 0, result.stderr
    return Path(json.loads(result.stdout)["run_dir"])


def same_but_id(first: RunDir, again: RunDir) -> None:
    """The two runs' specs are the same but for the run id, and the second names the first as its origin."""
    assert replace(again.spec(), run_id="x") == replace(first.spec(), run_id="x")
    assert again.typed_record().from_run == first.run_id and first.typed_record().from_run is None
    assert again.typed_record().options == first.typed_record().options


def final_weights(path: Path) -> dict[str, Any]:
    import torch

    (model,) = list(path.rglob("final_model.pt"))
    return torch.load(model, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]


def test_from_a_local_run_reproduces_its_spec_and_its_final_weights(tmp_path: Path) -> None:
    """One process (the test-bed test below reruns a two-rank world on two hosts)."""
    import torch

    runs = tmp_path / "runs"
    first = RunDir.open(run_dir_of(ddpctl("up", "--gpus", "1", "--seed", "5", "--lr", "0.05", *TINY,
                                          "--runs-dir", str(runs), "--json")))
    again = RunDir.open(run_dir_of(ddpctl("up", "--from", str(first.path), "--runs-dir", str(runs), "--json")))
    same_but_id(first, again)
    weights, weights_again = final_weights(first.path), final_weights(again.path)
    assert weights.keys() == weights_again.keys()
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
    # A different seed is a different run: the comparison above can fail.
    other = RunDir.open(run_dir_of(ddpctl("up", "--from", str(first.path / "run.json"), "--seed", "6",
                                          "--runs-dir", str(runs), "--json")))
    assert other.spec().seed == 6 and other.typed_record().from_run == first.run_id
    other_weights = final_weights(other.path)
    assert not all(torch.equal(weights[k], other_weights[k]) for k in weights)


def test_from_overrides_recorded_options_and_needs_env_values_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr("launcher.places.registry.run_up",
                        lambda spec, options: calls.append((spec, options)) or UpResult(None, 0, None))
    spec_fields = {"run_id": "orig-1", "model": "mnist-cnn", "dataset": "synthetic", "epochs": 4, "batch_size": 16,
                   "lr": 0.1, "nnodes": 2, "nproc_per_node": 3, "seed": 9, "extra_env": {"TOKEN": "***"}}
    run = tmp_path / "orig-1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "record_version": 2, "run_id": "orig-1", "spec": spec_fields,
        "options": {"host": ["alice@h1", "h2:2222"], "epochs": 4, "batch_size": 16, "lr": 0.1, "seed": 9,
                    "gpus": 3, "runtime": "docker", "image": "mine:2", "env_names": ["TOKEN"]}}))
    with pytest.raises(SystemExit):
        cli.main(["up", "--from", str(run), "--dry-run"])
    assert "run orig-1 was started with --env TOKEN" in capsys.readouterr().err
    cli.main(["up", "--from", str(run), "--env", "TOKEN=t", "--epochs", "1", "--dry-run"])
    spec, options = calls[0]
    assert (spec.epochs, spec.lr, spec.seed, spec.nproc_per_node, spec.nnodes) == (1, 0.1, 9, 3, 2)
    assert [h.text for h in options.hosts] == ["alice@h1", "h2:2222"] and options.image == "mine:2"
    assert options.runtime == "docker" and options.record["from_run"] == "orig-1"


def test_from_a_run_without_recorded_options_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "old"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "old", "spec": {"run_id": "old"}}))
    with pytest.raises(SystemExit):
        cli.main(["up", "--from", str(run)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no recorded options (written by an older ddpctl)" in err


needs_bed = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


@pytest.fixture(scope="module")
def bed(two_hosts: Any) -> Iterator[Any]:
    from tests.testbed_fixtures import lent

    yield from lent(two_hosts)


def planned_lines(run: RunDir) -> list[str]:
    """What each node was told to run (its trainer argv), with the run id taken out."""
    (event,) = [e for e in run.events() if e["event"] == "planned"]
    return [line.replace(run.run_id, "RUN") for line in event["nodes"]]


@needs_bed
@pytest.mark.timeout(600)
def test_from_a_test_bed_run_uses_the_same_hosts_spec_and_trainer_argv(bed: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    hosts = [arg for h in bed.hosts for arg in ("--host", h.spec)]
    first = RunDir.open(run_dir_of(run_ddpctl(bed, "up", *hosts, "--gpus", "1", "--seed", "2", *TINY,
                                              "--runs-dir", str(runs), "--json")))
    again = RunDir.open(run_dir_of(run_ddpctl(bed, "up", "--from", str(first.path), "--runs-dir", str(runs),
                                              "--json")))
    same_but_id(first, again)
    assert again.record()["hosts"] == first.record()["hosts"]
    assert planned_lines(again) == planned_lines(first)
    weights, weights_again = final_weights(first.path), final_weights(again.path)
    import torch

    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
