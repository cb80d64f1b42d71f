"""Which tests must run on one pytest-xdist worker together (`-n N --dist loadgroup`, as infra/test.sh runs them).

A test goes to any free worker unless it shares something that is made once per session or per module:

- the Slurm cluster (`slurm_cluster`, session-scoped: one cluster per run, not one per worker);
- a module-scoped fixture (a run made once and read by several tests, a module's test bed): the module's tests
  that use one run on one worker, in their order, so the fixture is still made once; so does a test that asks for
  fixtures by name (`request.getfixturevalue`) in a module that defines module-scoped ones;
- a fixed resource named by an explicit `@pytest.mark.xdist_group(NAME)` (e.g. a script's fixed port on
  localhost): every test naming it runs on one worker, one at a time.

xdist joins several group names of one test into a new group, so each test gets at most one: an explicit mark
first, then the Slurm cluster, then its module.

The longest first: a long group or test handed out late (test_slurm_*, with the cluster's minute-long time limits,
one test after another on one worker; test_remote_docker's image shipping) is what the whole run waits for at its
end. The Slurm cluster's tests are handed out first, then the e2e tier, then the integration tier, then the unit
tier, whose short tests fill the workers' gaps at the end; within a tier a test others wait for comes first
(FIRST_IN_TIER), then the groups and tests known to be long (KNOWN_SECONDS, longest first), and the collection order
is kept among the rest. pytest-xdist 3.6 and later
would hand the groups out by their number of tests instead (its --loadscope-reorder, on by default: a group of 45
quick tests before the Slurm cluster's, a 2-minute single test after every group), so this plugin turns that off.
"""

from __future__ import annotations

import pytest

from tests.tiers import module_key, tier_of

SESSION_GROUPS = ("slurm_cluster",)  # session fixtures that must exist once per run
# The order groups are handed out in (lowest first): the Slurm cluster's, then by tier.
_FIRST = {"slurm_cluster": 0, "e2e": 1, "integration": 2, "unit": 3}

# Seconds that a group (its name) or an ungrouped test (its node id, parameters left out; or its file's path, for every
# ungrouped test of the file) took in CI at c25b809
# (4 workers; `--durations=30`, setup + call + teardown, summed per group), for the 30 slowest: handed out longest
# first within their tier. A figure only orders; one gone stale moves a group earlier or later, never changes
# what runs (tests/test_worker_groups.py checks that each still names a group or test of the suite).
KNOWN_SECONDS = {
    "module:test_remote_docker": 236,
    "module:faults/test_lost_contact": 139,
    "tests/test_base_image_offline.py": 131,  # its one test
    "module:faults/test_hang_stacks": 102,
    "module:test_varied_hosts": 81,
    "tests/test_vast_shared_pacing.py::test_twelve_offers_processes_at_once_keep_to_ten_searches_a_minute_together": 62,
    "module:test_remote_up": 55,
    "module:faults/test_hang": 47,
    "module:faults/test_failure_attribution": 38,
    "module:test_vast_market": 35,
    "module:faults/test_fault_matrix": 35,
    "module:test_docs": 33,
    "module:test_vast_up": 29,
    "tests/test_compose.py::test_two_nodes_train_to_the_end_and_leave_nothing_behind": 29,
    "module:test_launchers_hosts": 29,
    "tests/test_vast_lifecycle.py::test_detached_run_is_autostopped_then_down_starts_pulls_verifies_and_destroys": 28,
    "tests/test_strategy_launch.py::test_sweep_of_strategies_by_process_count_writes_the_comparison_table_and_plot"
    "s": 44,
    "tests/test_stack_dumps.py::test_a_stalled_local_run_names_where_each_rank_waits_before_it_is_stopped": 80,
}


def group_of(item: pytest.Item) -> str | None:
    """The worker group an item must join, or None when any worker may run it."""
    if item.get_closest_marker("xdist_group") is not None:
        return None  # named by the test itself
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    for name in SESSION_GROUPS:
        if name in defs:
            return name
    if any(fixture.scope == "module" for chain in defs.values() for fixture in chain):
        return f"module:{module_key(item)}"
    if _asks_for_fixtures_by_name(item) and _module_defines_module_fixtures(item):
        # `request.getfixturevalue(NAME)` may ask for one at run time, which the test's fixture list does not show:
        # on another worker the module's fixture (a test bed, a run) would be made a second time.
        return f"module:{module_key(item)}"
    return None


def _asks_for_fixtures_by_name(item: pytest.Item) -> bool:
    code = getattr(getattr(item, "function", None), "__code__", None)
    return code is not None and "getfixturevalue" in code.co_names


def _module_defines_module_fixtures(item: pytest.Item) -> bool:
    module = item.getparent(pytest.Module)
    if module is None:
        return False
    manager = item.session._fixturemanager
    return any(fixture.scope == "module" and fixture.baseid == module.nodeid
               for chain in manager._arg2fixturedefs.values() for fixture in chain)


# Tests whose work others wait for, handed out first in their tier: the offline base-image build is the suite's base
# image on a fresh machine, which the Docker tests' fixture waits for rather than building it again
# (tests/docker_fixtures.py); started after a Docker test, it would build a second one.
FIRST_IN_TIER = ("tests/test_base_image_offline.py",)


def known_seconds(scope: str) -> int:
    """KNOWN_SECONDS of a group's name, or of an ungrouped test's node id (any parameters) or file, else 0."""
    for key in (scope, scope.split("[")[0], scope.split("::")[0]):
        if key in KNOWN_SECONDS:
            return KNOWN_SECONDS[key]
    return 0


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # hand the groups out in the order collected (see above)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the tests' ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    scopes: list[str] = []
    first: dict[str, tuple[int, int, int]] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        marked = item.get_closest_marker("xdist_group")
        scope = str(marked.kwargs.get("name", marked.args[0] if marked.args else "")) if marked else item.nodeid
        rank = _FIRST["slurm_cluster"] if group == "slurm_cluster" else _FIRST[tier_of(item)]
        key = (rank, 0 if scope.split("::")[0] in FIRST_IN_TIER else 1, -known_seconds(scope))
        first[scope] = min(key, first.get(scope, key))
        scopes.append(scope)
    order = sorted(range(len(items)), key=lambda i: first[scopes[i]])  # stable: collection order within a rank
    items[:] = [items[i] for i in order]
