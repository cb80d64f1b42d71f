"""Typed records: run.json and the Vast ledger read in one place; a corrupt, truncated, wrong-type or foreign
run.json is one line naming the file for status, logs, pull, down and report, with exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.cli import app as cli
from launcher.places.vast.ledger import Ledger
from launcher.results.record import RECORD_VERSION, RecordError, RunRecord, load_run_record
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec
from tests.test_report import write_run

GOOD_SPEC = {"run_id": "r1", "model": "mnist-cnn", "dataset": "synthetic", "epochs": 1, "batch_size": 32,
             "lr": 0.01, "nnodes": 1, "nproc_per_node": 1}

BAD_FILES = {
    "truncated": ('{"run_id": "r1", "spec": {"run_id": "r1", "mod', "not valid JSON (truncated?)"),
    "empty": ("", "empty"),
    "foreign": ('{"name": "my-package", "version": "1.0"}', "not a ddpctl run record (no run_id and spec)"),
    "list": ("[1, 2, 3]", "not a ddpctl run record (a JSON list"),
    "wrong-type": (json.dumps({"run_id": "r1", "spec": "mnist"}), "spec is a string, expected an object"),
    "newer": (json.dumps({"run_id": "r1", "spec": GOOD_SPEC, "record_version": RECORD_VERSION + 1}),
              "newer than this ddpctl reads"),
}


def bad_run(tmp_path: Path, kind: str) -> Path:
    """A finished run directory (timing, summary) whose run.json is then replaced by a bad one."""
    write_run(tmp_path / "runs", "r1", 1)
    run_json = tmp_path / "runs" / "r1" / "run.json"
    run_json.write_text(BAD_FILES[kind][0])
    return run_json


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["status", "logs", "pull", "down", "report"])
def test_a_bad_run_json_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                              kind: str) -> None:
    run_json = bad_run(tmp_path, kind)
    args = [command, str(run_json.parent)] if command == "report" else [command, "r1", "--runs-dir",
                                                                          str(tmp_path / "runs")]
    if command == "report":
        args += ["--out", str(tmp_path / "report")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert str(run_json) in err and BAD_FILES[kind][1] in err
    assert "Traceback" not in err and "no run.json" not in err
    assert not (tmp_path / "report").exists()  # nothing half-written


def test_an_older_run_json_without_version_or_new_fields_still_reads(tmp_path: Path) -> None:
    write_run(tmp_path, "old", 2)  # run_id, spec, created, as every run.json before the version existed
    record = load_run_record(tmp_path / "old" / "run.json")
    assert record.record_version == 1 and record.node_facts is None and record.from_run is None
    assert RunDir.open(tmp_path / "old").spec().nproc_per_node == 2


def test_record_round_trips_typed_fields_and_keeps_provider_fields(tmp_path: Path) -> None:
    facts = [{"python": "3.11.9", "torch": "2.13.0", "cuda": None, "driver": None, "gpus": []}]
    record = RunRecord(run_id="r1", spec=GOOD_SPEC, node_facts=facts, from_run="r0", options={"gpus": 1},
                       extra={"hosts": ["a", "b"], "instances": []})
    again = RunRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record
    with pytest.raises(RecordError, match="node_facts must be a list of objects"):
        RunRecord.from_json({**record.to_json(), "node_facts": ["python 3.11"]})


def test_run_dir_create_writes_the_current_version_and_node_facts_pass_through(tmp_path: Path) -> None:
    spec = RunSpec(run_id="made", nproc_per_node=1)
    run_dir = RunDir.create(tmp_path, spec, {"node_facts": [{"torch": "2.13.0"}]})
    record = run_dir.typed_record()
    assert record.record_version == RECORD_VERSION and record.node_facts == [{"torch": "2.13.0"}]
    assert record.code_hash and record.versions and record.versions["ddpctl"]


def test_a_ledger_entry_of_the_wrong_type_is_one_line_naming_run_json(tmp_path: Path) -> None:
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="rented", nproc_per_node=1),
                            {"provider": "vast", "instances": [{"instance_id": "12", "state": "rented"}]})
    with pytest.raises(RecordError, match=r"run\.json: an instance's instance_id is '12', expected an integer"):
        Ledger(run_dir)
    run_dir.update_record(instances=[{"instance_id": 12, "state": "rented", "dph": 0.5, "created_at": 1.0,
                                      "ssh_host": "h", "node": 0}])
    ledger = Ledger(run_dir)
    assert ledger.instances[0]["ssh_host"] == "h" and ledger.hourly_rate() == 0.5
