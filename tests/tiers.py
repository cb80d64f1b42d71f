"""The suite's three tiers, as markers, and the guard that keeps the fast one honest.

- `unit`: no process boundary and no network: pure functions, parsers, plans, records, in one Python process.
  `pytest -m unit` is the tier to run while working (about a minute).
- `integration`: starts processes (ddpctl as a subprocess, a local torchrun, git) or talks over loopback to a
  stand-in (Vast's API, a registry), but needs no test bed and no Docker engine.
- `e2e`: the multi-host test bed (network namespaces, sshd), a Docker engine, compose, a Slurm cluster.

A test's tier is what it is marked (`@pytest.mark.integration`, a module's `pytestmark`); a test marked `testbed`
or `docker`, or using a fixture that starts a bed, is `e2e`; the modules listed below are of their tier as a
whole, and the single tests listed are `integration`; everything else is `unit`. A `unit` test runs under a
guard: starting a process (subprocess, fork, spawn, exec, os.system) or opening an internet socket fails it with
a line that names the tier it belongs to, so a slow test cannot hide in the fast tier. `DDPCTL_TIER_GUARD=all`
puts every selected test under the guard (to find the unit tests of a new module); `=0` turns it off.
"""

from __future__ import annotations

import multiprocessing.util
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

TIERS = ("unit", "integration", "e2e")

# Whole modules (path relative to tests/, without .py) whose every test is of one tier.
E2E_MODULES = {
    "test_remote_up", "test_docker_runtime", "test_remote_docker", "test_compose", "test_image",
    "test_vast_up", "test_vast_market", "test_vast_testbed", "test_vast_lifecycle", "test_live_output",
    "test_rerun", "test_script_outputs", "test_env_secrets", "test_reattach_paths", "test_testbed",
    "test_ssh", "test_sync", "test_rdzv_reservation", "test_closed_terminal",
    "faults/test_disk_full", "faults/test_fault_matrix", "faults/test_failure_attribution", "faults/test_hang",
    "faults/test_interruption_outcomes", "test_slurm_cluster",
}
INTEGRATION_MODULES = {
    "test_local_up", "test_user_command_refusals", "test_strategies_runs", "test_session_leaks",
    "test_trainer_torchrun", "test_launcher_alone", "test_flag_forms", "test_torch_choice", "test_image_labels",
    "test_vast_client", "test_vast_provision", "test_vast_scoped_key", "test_vast_apikey", "test_worker_groups",
}
# Single tests of otherwise-unit modules ("module::function", parameters left out).
INTEGRATION_TESTS = {
    "test_bad_input::test_bad_input_is_named_in_one_line",
    "faults/test_failure_reasons::test_a_script_needing_cuda_on_a_host_without_gpus_gets_one_hint",
    "test_disk_and_hangs::test_a_rank_whose_snapshot_write_fails_makes_every_rank_leave",
    "test_layout::test_the_layers_and_acyclic_packages_hold",
    "test_layout::test_the_check_fails_on_an_upward_import_in_a_scratch_copy",
    "test_local_checks::test_local_up_where_localhost_does_not_resolve_is_refused_before_anything_is_written",
    "test_reference_equivalence::test_two_process_epoch_equals_reference_loop_under_torchrun",
    "test_script_progress::test_the_state_poll_brings_new_output_by_offset_and_the_rest_of_an_ended_attempt",
    "test_spec_plan::test_detach_script_passes_hostile_arguments_intact",
    "test_spec_plan::test_stop_kills_workers_that_left_the_process_group",
    "test_strategy_launch::test_sweep_of_strategies_by_process_count_writes_the_comparison_table_and_plots",
    "test_sweep::test_local_sweep_interrupted_after_its_first_run_resumes_with_the_second",
    "test_sweep::test_local_sweep_on_synthetic_data_runs_both_layouts_and_reports",
    "test_trainer_units::test_bf16_run_records_its_precision_and_its_snapshots_resume_only_bf16",
    "test_trainer_units::test_missing_data_is_one_line_error",
    "test_vast_offers::test_max_cost_that_bandwidth_alone_would_use_up_rents_nothing",
    "test_vast_offers::test_no_offer_that_cannot_run_the_image_is_ever_chosen",
    "test_vast_offers::test_offer_strings_print_literally_in_the_table",
    "test_vast_offers::test_offers_explain_lists_the_excluded_and_why",
    "test_vast_offers::test_search_sorts_by_price_with_our_disk",
}
E2E_FIXTURES = {"testbed", "two_hosts", "bed", "docker_bed", "base_image", "test_image", "small_image", "slurm_cluster"}


def module_key(item: pytest.Item) -> str:
    path = str(item.path)
    marker = f"{os.sep}tests{os.sep}"
    rel = path.rsplit(marker, 1)[-1]
    return rel[:-3] if rel.endswith(".py") else rel


def tier_of(item: pytest.Item) -> str:
    """The tier an item is marked with, else the one its markers, fixtures or module imply."""
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier
    if item.get_closest_marker("testbed") or item.get_closest_marker("docker"):
        return "e2e"
    if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "e2e"
    module = module_key(item)
    if module in E2E_MODULES:
        return "e2e"
    if module in INTEGRATION_MODULES or f"{module}::{item.name.split('[')[0]}" in INTEGRATION_TESTS:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))


class CrossedBoundary(Exception):
    """A unit test started a process or opened a network connection."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise CrossedBoundary(f"a unit test {what}: mark it @pytest.mark.integration (or e2e), see tests/tiers.py")
    return refuse


def _guarded_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    def connect(sock: socket.socket, address: Any, *args: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise CrossedBoundary(f"a unit test connected to {address!r}: mark it @pytest.mark.integration "
                                  "(or e2e), see tests/tiers.py")
        return original(sock, address, *args)
    return connect


@pytest.fixture(autouse=True)
def _unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a `unit` test that starts a process or connects over the network."""
    probing = os.environ.get("DDPCTL_TIER_GUARD") == "all"  # classify: every test under the guard
    if (request.node.get_closest_marker("unit") is None and not probing) or os.environ.get("DDPCTL_TIER_GUARD") == "0":
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp",
                 "execvpe"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"called os.{name}"))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse("started a process"))
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect(socket.socket.connect_ex))
    yield
