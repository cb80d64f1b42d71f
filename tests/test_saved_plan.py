"""The plan is the object that runs: RunPlan reads back from its JSON losslessly, `up --dry-run --save-plan FILE`
saves the plan it printed, `up --plan FILE` runs exactly it, and a plan that cannot be used is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import PlanError
from launcher.planning.facts import HostAddress, HostFacts
from launcher.planning.plan import NodeHost, RunPlan, Shipment, plan_remote
from launcher.planning.plan_file import load_plan
from launcher.runtimes.docker import DockerRuntime
from launcher.spec.run_spec import RunSpec
from tests import cli_runner

ROOT = Path(__file__).resolve().parent.parent


def every_field_set() -> RunPlan:
    """A plan none of whose fields (nested ones included) is left at its default."""
    spec = RunSpec(run_id="every-field", model="resnet18", dataset="cifar10", data_dir="/data/c10", epochs=7,
                   batch_size=16, lr=0.05, save_every=2, seed=9, max_restarts=3, nproc_per_node=2, nnodes=2,
                   backend="gloo", trainer_args=("--synthetic-train-size", "512"), rdzv_port=29555,
                   python="/opt/py/bin/python3", strategy="local-sgd", threads_per_process=3, average_every="4",
                   precision="bf16")
    hosts = [NodeHost("alice@10.0.0.2:2222", "10.0.0.2", "eth1", gpus=True),
             NodeHost("bob@10.0.0.3", "10.0.0.3", "eth2", gpus=True)]
    plan = plan_remote(spec, hosts, "10.0.0.2", DockerRuntime("registry.example/ddpctl:7"))
    facts = tuple(HostFacts(label=h.label, python="3.11.7", executable="/usr/bin/python3", cpus=8, home="/home/u",
                            torch="2.3.1+cu121", torch_error="none here", torch_cuda="cu121", driver="550.54",
                            gpu_names=("NVIDIA A10",), disk_free=123456789, ssh_server_addr=h.address,
                            addrs=(HostAddress("eth1", str(h.address), 24),), docker=True, version=1) for h in hosts)
    nodes = tuple(dataclasses.replace(n, secret_names=("NOT_SECRET_HERE",)) for n in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes, pull_image=True, unknown=("a thing: shown as x",),
                               node_facts=facts, ship=Shipment("/src/proj", "/trainer", "sha256:" + "ab" * 32,
                                                               "sha256:" + "cd" * 32))


def non_default_fields(obj: Any, where: str) -> list[str]:
    """The dataclass fields of obj (and of the dataclasses inside it) still at their default: none may be, or the
    round trip would not show that the field survives."""
    left = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if f.name != "version" and (value == default or value in ((), None, "")):  # version: one exists
            left.append(f"{where}.{f.name}")
        items = value if isinstance(value, tuple) else (value,)
        for i, item in enumerate(items):
            if dataclasses.is_dataclass(item) and not isinstance(item, RunSpec):
                left += non_default_fields(item, f"{where}.{f.name}[{i}]")
    return left


def test_every_field_of_the_plan_round_trips_through_its_json() -> None:
    plan = every_field_set()
    assert non_default_fields(plan, "plan") == []
    text = json.dumps(plan.to_json())
    back = RunPlan.from_json(json.loads(text))
    assert back == plan
    assert back.node_facts == plan.node_facts  # not part of == (the facts of the moment)
    assert back.spec == plan.spec and back.nodes[1].host == plan.nodes[1].host and back.ship == plan.ship
    assert json.dumps(back.to_json()) == text


def test_env_values_are_never_in_the_json_and_come_back_as_withheld_names() -> None:
    spec = RunSpec(run_id="secret", nnodes=2, extra_env=(("TOKEN", "s3cr3t"),))
    plan = plan_remote(spec, [NodeHost("a@h1", "10.0.0.1"), NodeHost("b@h2", "10.0.0.2")])
    data = plan.to_json()
    assert "s3cr3t" not in json.dumps(data)
    back = RunPlan.from_json(data)
    assert back.spec.withheld_env == ("TOKEN",) and back.to_json() == data


def good() -> dict[str, Any]:
    return dataclasses.replace(every_field_set(), unknown=()).to_json()


REFUSED: dict[str, tuple[Any, str]] = {  # the file's content (None: no file) and what the one line says
    "missing": (None, "no such file"),
    "not json": ("{not json", "it is not JSON"),
    "not a plan": ({"nodes": []}, "not a ddpctl plan"),
    "newer": ({**good(), "plan_version": 99}, "made by a newer ddpctl"),
    "wrong shape": ({**good(), "nodes": "node 0"}, "its field nodes is str, where ddpctl writes list"),
    "older": ({**good(), "plan_version": 0}, "made by an older ddpctl (plan version 0; this one reads version 1)"),
    "extra key": ({**good(), "priority": "high"}, "a field priority that ddpctl does not write"),
    "missing key": ({k: v for k, v in good().items() if k != "rdzv_addr"}, "its field 'rdzv_addr' is missing"),
    "node field type": ({**good(), "nodes": [{**good()["nodes"][0], "index": "0"}, *good()["nodes"][1:]]},
                        "its field nodes[0].index is str, where ddpctl writes int"),
    "nested extra key": ({**good(), "nodes": [{**good()["nodes"][0], "gpu_count": 8}, *good()["nodes"][1:]]},
                         "a field nodes[0].gpu_count that ddpctl does not write"),
    "spec field type": ({**good(), "spec": {**good()["spec"], "run_id": 7}},
                        "its field spec.run_id is 7 (int), where ddpctl writes str"),
    "spec field bool as int": ({**good(), "spec": {**good()["spec"], "nnodes": True}},
                               "its field spec.nnodes is true (bool), where ddpctl writes int"),
    "ship field type": ({**good(), "ship": {**good()["ship"], "digest": ["sha256:00"]}},
                        "its field ship.digest is list, where ddpctl writes str"),
    "bad spec": ({**good(), "spec": {**good()["spec"], "epochs": 0}}, "its spec is not valid"),
    "unknowns": ({**good(), "unknown": ["node addresses and network interfaces (shown as the names given)"]},
                 "leaves node addresses and network interfaces unknown"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_plan_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    content, said = REFUSED[case]
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(PlanError) as refused:
        load_plan(path)
    message = str(refused.value)
    assert message.startswith(f"--plan {path}: ") and said in message and "\n" not in message


def test_a_plan_without_the_values_of_its_env_is_refused(tmp_path: Path) -> None:
    spec = RunSpec(run_id="secret", nnodes=2, extra_env=(("TOKEN", "s3cr3t"),))
    plan = plan_remote(spec, [NodeHost("a@h1", "10.0.0.1"), NodeHost("b@h2", "10.0.0.2")])
    plan = dataclasses.replace(plan, ship=Shipment("/src", "/trainer", "sha256:00"))
    with pytest.raises(PlanError, match="holds no values for --env TOKEN"):
        (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
        load_plan(tmp_path / "plan.json")


def ddpctl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_runner.ddpctl(*args, cwd=cwd)


@pytest.mark.integration
def test_a_saved_local_plan_runs_as_it_is_and_only_once(tmp_path: Path) -> None:
    small = ["--epochs", "1", "--gpus", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64"]
    dry = ddpctl(tmp_path, "up", "--dry-run", "--save-plan", "p.json", *small)
    assert dry.returncode == 0, dry.stderr
    saved_text = (tmp_path / "p.json").read_text()
    assert not (tmp_path / "runs").exists()  # a dry run writes only the plan file
    assert RunPlan.from_json(json.loads(saved_text)).describe() == dry.stdout.rstrip("\n")  # what it printed
    ran = ddpctl(tmp_path, "up", "--plan", "p.json", "--json")
    assert ran.returncode == 0, ran.stderr
    run_dir = Path(json.loads(ran.stdout)["run_dir"])
    assert json.loads((run_dir / "plan.json").read_text()) == json.loads(saved_text)
    assert json.loads(ran.stdout)["summary"]["epochs"] == 1
    again = ddpctl(tmp_path, "up", "--plan", "p.json")
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "has run already" in again.stderr
    mixed = ddpctl(tmp_path, "up", "--plan", "p.json", "--epochs", "3")
    assert mixed.returncode == 1 and mixed.stderr.count("\n") == 1 and "drop --epochs" in mixed.stderr
    no_dry = ddpctl(tmp_path, "up", "--save-plan", "q.json", *small)
    assert no_dry.returncode == 1 and "add --dry-run" in no_dry.stderr and not (tmp_path / "q.json").exists()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
