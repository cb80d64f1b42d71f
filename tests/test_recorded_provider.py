"""A recorded run's place (local, SSH hosts, rented, a Slurm job) and runtime, rebuilt from its typed run.json
(what status/logs/pull/down ask)."""

from __future__ import annotations

import pytest

from launcher.places.registry import place_of_record
from launcher.results.record import RecordError, RunRecord
from launcher.runtimes.docker import DockerRuntime
from launcher.runtimes.native import NativeRuntime
from launcher.runtimes.start import runtime_of

HOST = {"user": "u", "host": "10.0.0.2", "port": 22}


def record(**fields: object) -> RunRecord:
    return RunRecord.from_json({"run_id": "r1", "spec": {}, **fields})


@pytest.mark.parametrize(("fields", "place"), [
    ({}, "local"),  # a record older than `provider`, run here
    ({"provider": "local", "hosts": []}, "local"),
    ({"provider": "ssh", "hosts": [HOST]}, "ssh"),
    ({"hosts": [HOST]}, "ssh"),  # a host run recorded before `provider`
    ({"provider": "vast", "instances": []}, "vast"),  # rented, never reached: no hosts yet
    ({"provider": "vast", "hosts": [HOST], "instances": [{"instance_id": 1}]}, "vast"),
    ({"provider": "slurm", "hosts": [HOST], "slurm": {"job_id": "7"}}, "slurm"),
])
def test_the_recorded_run_is_rebuilt_from_the_record(fields: dict[str, object], place: str) -> None:
    assert place_of_record(record(**fields)).name == place


def test_the_runtime_is_rebuilt_from_the_record() -> None:
    assert isinstance(runtime_of(record()), NativeRuntime)
    docker = runtime_of(record(runtime="docker", options={"image": "ddpctl-trainer:1"}))
    assert isinstance(docker, DockerRuntime) and docker.image == "ddpctl-trainer:1"
    assert docker.stop_grace_seconds > NativeRuntime().stop_grace_seconds
    with pytest.raises(RecordError, match="runtime 'podman'"):
        runtime_of(record(runtime="podman"))
