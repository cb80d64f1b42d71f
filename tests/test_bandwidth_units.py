"""The network's figures without a network: nccl-tests' definitions in the nodes' program, the message sizes, the
gradient sizes against the trainer's own models, what doctor reads from rank 0's line, and the report's
exposed-communication column per layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.execute.hosts import bandwidth as launcher_bw
from launcher.planning.facts import HostAddress, HostFacts
from launcher.results.report import render_markdown, row_cells
from launcher.results.run_figures import load_run, scaling_table
from launcher.spec.gradient_size import GRADIENT_BYTES
from tests.test_report import write_run
from trainer import bandwidth
from trainer.models import build_model


def test_bus_bandwidth_is_nccl_tests_all_reduce_factor() -> None:
    assert bandwidth.bus_factor(2) == 1.0 and bandwidth.bus_factor(4) == 1.5 and bandwidth.bus_factor(8) == 1.75


def test_message_sizes_run_from_8_bytes_up_to_the_gradient_exactly() -> None:
    assert bandwidth.message_sizes(87_360) == [8, 64, 512, 4096, 32768, 87_360]
    assert bandwidth.message_sizes(4096) == [8, 64, 512, 4096]
    assert bandwidth.message_sizes(3) == [8]
    assert all(size % 4 == 0 for size in bandwidth.message_sizes(44_726_570))


def test_the_launcher_sends_the_program_with_the_same_result_mark() -> None:
    assert launcher_bw.RESULT_MARK == bandwidth.RESULT_MARK
    assert launcher_bw.PROGRAM.read_text() == Path(bandwidth.__file__).read_text()


@pytest.mark.parametrize(("model", "shape"), [("mnist-cnn", (1, 28, 28)), ("mnist-cnn-small", (1, 28, 28)),
                                              ("mnist-cnn", (3, 32, 32)), ("mnist-cnn-small", (3, 32, 32))])
def test_gradient_sizes_are_the_trainer_models_parameters(model: str, shape: tuple[int, int, int]) -> None:
    counted = sum(p.numel() * p.element_size() for p in build_model(model, shape).parameters())
    dataset = "cifar10" if shape[0] == 3 else "mnist"
    assert GRADIENT_BYTES[(model, dataset)] == counted
    if dataset == "mnist":
        assert GRADIENT_BYTES[(model, "synthetic")] == counted


def facts(label: str, iface: str, addr: str) -> HostFacts:
    return HostFacts(label, ssh_server_addr=addr,
                     addrs=(HostAddress("lo", "127.0.0.1", 8), HostAddress(iface, addr, 24)))


NODES = [facts("a@10.0.0.2", "eth0", "10.0.0.2"), facts("b@10.0.0.3", "ens5", "10.0.0.3"),
         facts("c@10.0.0.4", "enp1s0", "10.0.0.4")]


def test_each_node_is_told_node_0s_address_and_its_own_interface() -> None:
    argv = launcher_bw.node_argv("python3", NODES, 1, 29400, 87_360)
    assert argv[0] == "python3" and argv[1] == "-c"
    assert argv[3:] == ["1", "3", "10.0.0.2", "29400", "ens5", "87360", "gloo", str(launcher_bw.SECONDS)]
    gpu = [HostFacts(f.label, ssh_server_addr=f.ssh_server_addr, addrs=f.addrs, gpu_names=("H100",),
                     torch_cuda="cu121") for f in NODES]
    assert launcher_bw.backend_for(gpu) == "nccl" and launcher_bw.backend_for(NODES) == "gloo"


def test_rank_0s_line_becomes_the_figures_with_the_slowest_pair_named() -> None:
    found = {"nodes": 3, "backend": "gloo", "max_bytes": 87_360, "busbw_gbit_s": 0.3, "latency_ms": 0.2,
             "sizes": [{"bytes": 8, "time_ms": 0.2, "algbw_gbit_s": 0.0003, "busbw_gbit_s": 0.0004}],
             "pairs": [{"nodes": [0, 1], "busbw_gbit_s": 0.9}, {"nodes": [0, 2], "busbw_gbit_s": 0.05},
                       {"nodes": [1, 2], "busbw_gbit_s": 0.06}]}
    result = launcher_bw.figures("noise\n" + bandwidth.RESULT_MARK + json.dumps(found) + "\n", NODES)
    assert (result["busbw_gbit_s"], result["latency_ms"]) == (0.3, 0.2)
    assert result["ifaces"] == ["eth0", "ens5", "enp1s0"]
    assert result["slowest_pair"] == {"hosts": ["a@10.0.0.2", "c@10.0.0.4"], "busbw_gbit_s": 0.05}
    lines = launcher_bw.summary_lines(result)
    assert "bus bandwidth 0.3 Gbit/s at 87,360 B" in lines[0] and "latency 0.2 ms at 8 B" in lines[0]
    assert lines[1] == "slowest pair: a@10.0.0.2 and c@10.0.0.4, 0.05 Gbit/s"


def test_no_result_line_is_an_error_not_a_figure() -> None:
    from launcher.errors import DdpctlError

    with pytest.raises(DdpctlError, match="printed no result"):
        launcher_bw.figures("Traceback ...\n", NODES)


def test_the_report_shows_the_exposed_share_per_layout(tmp_path: Path) -> None:
    write_run(tmp_path, "r1", 1)
    write_run(tmp_path, "r2", 2, nnodes=2, seed=1)
    summary_path = tmp_path / "r2" / "summary.json"
    summary_path.write_text(json.dumps({**json.loads(summary_path.read_text()), "exposed_comm_fraction": 0.625}))
    rows = scaling_table([load_run(tmp_path / "r1"), load_run(tmp_path / "r2")])
    assert [r.exposed_comm_fraction for r in rows] == [None, 0.625]
    cells = [row_cells(r) for r in rows]
    assert [c[11] for c in cells] == ["-", "62%"]  # beside the efficiency
    markdown = render_markdown(rows)
    assert "| exposed comm |" in markdown and "| 62% |" in markdown


def with_network(run: Path, summary: dict[str, float], bandwidth: dict[str, object] | None = None) -> None:
    path = run / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **summary}))
    if bandwidth is not None:
        record = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**record, "bandwidth": bandwidth}))


def test_the_report_says_whether_the_network_limits_each_layout(tmp_path: Path) -> None:
    write_run(tmp_path, "one", 1)
    write_run(tmp_path, "slow", 2, nnodes=2, seed=1)
    write_run(tmp_path, "fast", 4, nnodes=4, seed=2)
    measured = {"busbw_gbit_s": 0.047, "latency_ms": 0.4,
                "sizes": [{"bytes": 8, "time_ms": 0.4}, {"bytes": 87_360, "time_ms": 15.0}]}
    with_network(tmp_path / "slow", {"exposed_comm_fraction": 0.8, "step_ms_no_sync": 5.0}, measured)
    with_network(tmp_path / "fast", {"exposed_comm_fraction": 0.05, "step_ms_no_sync": 5.0})
    rows = scaling_table([load_run(tmp_path / name) for name in ("one", "slow", "fast")])
    slow, fast = rows[1], rows[2]
    assert slow.busbw_gbit_s == 0.047 and slow.predicted_efficiency == pytest.approx(5.0 / 20.0)
    assert fast.busbw_gbit_s is None and fast.predicted_efficiency is None  # no bandwidth measured: not predicted
    markdown = render_markdown(rows)
    section = markdown.split("## Where a step's time goes", 1)[1]
    assert (f"- ddp 2x1 (`slow`): 80% of a step waited on communication that computation did not hide; bus "
            f"bandwidth 0.047 Gbit/s, measured before the run; the efficiency it allows 25%, measured "
            f"{100 * slow.efficiency:.0f}%: the network limits this layout's scaling.") in section
    assert "- ddp 4x1 (`fast`): 5% of a step waited on communication that computation did not hide: the network " \
           "is not what limits it." in section
    assert "`one`" not in section  # one process: nothing was synced, nothing is said


def test_no_exposed_share_measured_means_no_network_section(tmp_path: Path) -> None:
    write_run(tmp_path, "one", 1)
    write_run(tmp_path, "two", 2, nnodes=2, seed=1)
    rows = scaling_table([load_run(tmp_path / "one"), load_run(tmp_path / "two")])
    assert "Where a step's time goes" not in render_markdown(rows)


@pytest.mark.parametrize(("args", "line"), [
    (["doctor", "--host", "gpu1", "--bandwidth"],
     "error: --bandwidth measures the network between hosts: give two --host or more"),
    (["doctor", "--host", "gpu1", "--host", "gpu2", "--bandwidth", "--model", "vgg"],
     "error: --model vgg --dataset mnist: choose a model of mnist-cnn, mnist-cnn-small, resnet18 and a data set of "
     "cifar10, mnist, synthetic"),
    (["up", "--host", "gpu1", "--check-bandwidth", "--dataset", "synthetic"],
     "error: --check-bandwidth measures the network between SSH hosts: give two --host or more"),
    (["up", "--check-bandwidth", "--dataset", "synthetic"],
     "error: --check-bandwidth measures the network between SSH hosts: give two --host or more"),
])
def test_a_measurement_that_cannot_be_made_is_refused_in_one_line(tmp_path: Path, args: list[str],
                                                                 line: str) -> None:
    from tests.cli_in_process import ddpctl_in_process

    result = ddpctl_in_process(*args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path) if args[0] == "up" \
        else ddpctl_in_process(*args, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == line
    assert not (tmp_path / "runs").exists()


def test_check_bandwidth_on_hosts_without_torch_is_one_line_naming_them() -> None:
    from dataclasses import replace

    from launcher.errors import DdpctlError
    from launcher.planning.plan import NodeHost, plan_remote
    from launcher.spec.run_spec import RunSpec

    plan = plan_remote(RunSpec(run_id="r", nnodes=2), [NodeHost(f.label, f.ssh_server_addr) for f in NODES[:2]])
    plan = replace(plan, node_facts=(replace(NODES[0], torch="2.13.0"), NODES[1]))
    with pytest.raises(DdpctlError, match=r"needs torch: b@10.0.0.3 has none .*drop --check-bandwidth$"):
        launcher_bw.before_run(None, plan)  # type: ignore[arg-type]  # refused before any host is asked
