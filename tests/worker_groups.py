"""Which tests must run on one pytest-xdist worker together (`-n N --dist loadgroup`, as infra/test.sh runs them).

A test goes to any free worker unless it shares something that is made once per session or per module:

- the Slurm cluster (`slurm_cluster`, session-scoped: one cluster per run, not one per worker);
- a module-scoped fixture (a run made once and read by several tests, a module's test bed): the module's tests
  that use one run on one worker, in their order, so the fixture is still made once;
- a fixed resource named by an explicit `@pytest.mark.xdist_group(NAME)` (e.g. a script's fixed port on
  localhost): every test naming it runs on one worker, one at a time.

xdist joins several group names of one test into a new group, so each test gets at most one: an explicit mark
first, then the Slurm cluster, then its module.

The longest first: xdist hands out the groups (and the ungrouped tests) in the order they are collected, so a long
group collected late (test_slurm_*, with the cluster's minute-long time limits, one test after another on one
worker) would be what the whole run waits for at its end. The Slurm cluster's tests are handed out first, then
every other e2e group and test, then the integration tier, then the unit tier, whose short tests fill the workers'
gaps at the end; the collection order is kept within each.
"""

from __future__ import annotations

import pytest

from tests.tiers import module_key, tier_of

SESSION_GROUPS = ("slurm_cluster",)  # session fixtures that must exist once per run
# The order groups are handed out in (lowest first): the Slurm cluster's, then by tier.
_FIRST = {"slurm_cluster": 0, "e2e": 1, "integration": 2, "unit": 3}


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
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the tests' ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    scopes: list[str] = []
    first: dict[str, int] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        marked = item.get_closest_marker("xdist_group")
        scope = str(marked.kwargs.get("name", marked.args[0] if marked.args else "")) if marked else item.nodeid
        rank = _FIRST["slurm_cluster"] if group == "slurm_cluster" else _FIRST[tier_of(item)]
        first[scope] = min(rank, first.get(scope, rank))
        scopes.append(scope)
    order = sorted(range(len(items)), key=lambda i: first[scopes[i]])  # stable: collection order within a rank
    items[:] = [items[i] for i in order]
