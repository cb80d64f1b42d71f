"""torch's flight records read on a node (launcher/remote/flight_records.py) and the clause they add to a stalled
run's verdict (launcher/results/flight_verdict.py). The dumps here have the shape torch 2.13 writes (keys as
`torch._C._distributed_c10d._dump_fr_trace()` returns them for gloo; NCCL's add `completed` states); the real
dumps of a hung run are read by tests/test_stack_dumps.py and tests/faults/test_hang_stacks.py."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from launcher.remote import flight_records
from launcher.results.flight_verdict import flight_verdict


def entry(seq: int, op: str = "gloo:all_reduce", state: str = "scheduled", line: int = 42,
          group: tuple[str, str] = ("0", "default_pg")) -> dict[str, Any]:
    return {"frames": [{"name": "all_reduce", "filename": "/usr/lib/python3/site-packages/torch/distributed/"
                        "distributed_c10d.py", "line": 3245}, {"name": "main", "filename": "/w/code/train.py",
                                                               "line": line}],
            "record_id": seq - 1, "pg_id": int(group[0]), "process_group": group, "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "time_created_ns": 1, "input_sizes": [[4]],
            "state": state, "retired": False, "timeout_ms": 1800000, "is_p2p": False}


def dump(*entries: dict[str, Any]) -> bytes:
    return pickle.dumps({"version": "2.10", "pg_config": {}, "comm_lib_version": "", "pg_status": {},
                         "entries": list(entries)})


def test_each_rank_is_read_to_the_collective_it_entered_last(tmp_path: Path) -> None:
    (tmp_path / "fr-rank-0.pkl").write_bytes(dump(entry(1, "gloo:all_gather", line=37), entry(2), entry(3)))
    (tmp_path / "fr-rank-1.pkl").write_bytes(dump(entry(1, "gloo:all_gather", line=37), entry(2)))
    found = flight_records.collect(str(tmp_path), [0, 1], None)
    assert [f["rank"] for f in found] == [0, 1]
    assert found[0]["groups"][0]["last_entered"] == {"seq": 3, "op": "gloo:all_reduce", "state": "scheduled",
                                                     "at": "train.py:42"}
    assert flight_verdict(found) == ("flight recorder: rank 0 entered all_reduce (gloo) #3 (train.py:42); rank 1 "
                                     "entered up to #2 and never #3: collective #3 waits for the ranks that never "
                                     "entered it")


def test_ranks_in_different_collectives_of_the_same_number_are_told() -> None:
    summaries = [flight_records.summary(0, {"entries": [entry(5, "nccl:all_reduce", "started")]}),
                 flight_records.summary(1, {"entries": [entry(5, "nccl:broadcast", "started", line=50)]})]
    assert flight_verdict(summaries) == ("flight recorder: rank 0 entered all_reduce (nccl) #5 (train.py:42); rank 1 "
                                         "entered broadcast (nccl) #5 (train.py:50): the ranks called different "
                                         "collectives as #5")


def test_every_rank_in_the_same_collective_is_one_group_and_other_groups_wait_their_turn() -> None:
    side = ("1", "side")
    summaries = [flight_records.summary(r, {"entries": [entry(7, "nccl:all_reduce", "started"),
                                                        entry(2, "nccl:all_gather", "completed", group=side)]})
                 for r in range(3)]
    assert flight_verdict(summaries) == "flight recorder: ranks 0, 1, 2 entered all_reduce (nccl) #7 (train.py:42)"
    assert summaries[0]["groups"][1]["last_completed"]["seq"] == 2


def test_no_record_adds_nothing_and_a_rank_without_a_collective_is_named(tmp_path: Path) -> None:
    assert flight_records.collect(str(tmp_path), [0], None) == [] and flight_verdict([]) == ""
    summaries = [flight_records.summary(0, {"entries": [entry(1)]}),
                 {"rank": 1, "version": "", "groups": [{"group": "0", "last_entered": None, "last_completed": None}]}]
    assert flight_verdict(summaries).startswith("flight recorder: rank 0 entered all_reduce (gloo) #1 (train.py:42); "
                                                "rank 1 entered no collective")


# What pickle.dumps of an object whose __reduce__ names os.system writes (protocol 0, spelled out: the unit tier
# does not let this test hold os.system itself)
CALLS_SYSTEM = b"cposix\nsystem\n(S'touch /tmp/ddpctl-flight-record-ran'\ntR."


def test_a_dump_that_names_code_is_refused_not_run(tmp_path: Path) -> None:
    """The dumps come from the ranks' processes (on a rented machine, say): a pickle that calls anything is read
    as not a flight record, and nothing it names runs."""
    marker = Path("/tmp/ddpctl-flight-record-ran")
    marker.unlink(missing_ok=True)
    (tmp_path / "fr-rank-0.pkl").write_bytes(CALLS_SYSTEM)
    (tmp_path / "fr-rank-1.pkl").write_bytes(b"not a pickle")
    (tmp_path / "fr-rank-2.pkl").write_bytes(pickle.dumps(["a list"]))
    found = flight_records.collect(str(tmp_path), [0, 1, 2], None)
    assert not marker.exists()
    assert "global posix.system refused" in found[0]["error"] and "not a flight record" in found[1]["error"]
    assert found[2]["error"] == "not a flight record (no entries)"
    assert flight_verdict(found).startswith("flight recorder: rank 0's record unreadable (not a flight record")


def test_a_dump_past_the_bound_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight_records, "MAX_DUMP_BYTES", 100)
    (tmp_path / "fr-rank-0.pkl").write_bytes(dump(*[entry(n) for n in range(1, 20)]))
    (found,) = flight_records.collect(str(tmp_path), [0], None)
    assert found["error"].endswith("bytes, more than 100")


def test_a_rank_asked_for_its_record_is_awaited_and_nccls_timeout_dump_gives_way_to_it(tmp_path: Path) -> None:
    (tmp_path / "fr-trace-rank-0").write_bytes(dump(entry(1)))  # NCCL's, on a timeout, older
    (tmp_path / "fr-trace-rank-1").write_bytes(dump(entry(1)))
    asked = flight_records.request(str(tmp_path))
    assert (tmp_path / flight_records.REQUEST_FILE).stat().st_mtime == asked
    (tmp_path / "fr-rank-0.pkl").write_bytes(dump(entry(1), entry(2)))  # the rank's thread answered
    os.utime(tmp_path / "fr-rank-0.pkl", (asked + 1, asked + 1))
    found = flight_records.collect(str(tmp_path), [0], asked, wait=5)
    assert [(f["rank"], f["file"]) for f in found] == [(0, "fr-rank-0.pkl"), (1, "fr-trace-rank-1")]
