"""--max-cost before anything is rented (issue 42): the dry run's worst case of --expected-hours at the chosen
offers' prices against the budget, a run refused when that cannot fit, and a sweep's one budget shared by its runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.vast_standin import VastStandIn, make_offer
from launcher.errors import DdpctlError
from launcher.places.vast.budget import spent_under, sweep_run_request
from launcher.places.vast.client import VastClient
from launcher.places.vast.ledger import write_summary_cost
from launcher.places.vast.market import chosen_summary, find_offers, first_machines
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec
from launcher.spec.vast_request import VastRequest

pytestmark = pytest.mark.integration  # a stand-in over loopback (tests/tiers.py)

DISK = 16
# $0.25/hour of GPU plus 16 GB at $0.15/GB-month (1/3 of a cent an hour); bandwidth free unless a test prices it
HOURLY = 0.25 + 0.15 * DISK / 720


@pytest.fixture
def offers():
    usable = dict(dph_base=0.25, cuda_max_good=12.8, compute_cap=860, gpu_ram=10240,
                  end_date=time.time() + 30 * 86400, duration=30 * 86400.0)
    with VastStandIn(api_key="k", offers=[make_offer(1, 101, **usable)]) as standin:
        client = VastClient("k", base_url=standin.url, pace=0.0)

        def find(**request):
            req = VastRequest(disk=DISK, **request)
            found = find_offers(client, SimpleNamespace(model="mnist-cnn"), req, 1)  # type: ignore[arg-type]
            return chosen_summary(first_machines(found, 1), req)

        yield find
        assert standin.instances == {}  # nothing is ever rented here


def test_the_dry_run_shows_the_worst_case_of_the_expected_hours_against_the_budget(offers):
    line = offers(max_cost=2.0, expected_hours=4.0)
    assert f"worst case for --expected-hours 4: ${4 * HOURLY:.4f} against --max-cost $2 (fits)" in line


def test_a_run_whose_expected_hours_the_budget_cannot_pay_is_refused_before_renting(offers):
    with pytest.raises(DdpctlError) as err:
        offers(max_cost=2.0, expected_hours=10.0)
    said = str(err.value)
    assert "\n" not in said and said.startswith("--max-cost $2 does not cover --expected-hours 10:")
    assert f"${10 * HOURLY:.4f}" in said and "leave --expected-hours out" in said


def test_a_budget_without_expected_hours_says_how_long_it_lasts(offers):
    assert f"--max-cost $1 pays for about {1 / HOURLY:.2f} hour(s)" in offers(max_cost=1.0)
    assert "worst case" not in offers() and "--max-cost" not in offers()


def _rented_run(sweep: Path, run_id: str, cost: float, provider: str = "vast") -> None:
    RunDir.create(sweep, RunSpec(run_id=run_id), {"provider": provider, "cost_usd": cost})


def test_a_sweep_shares_one_budget_between_its_runs(tmp_path):
    req = VastRequest(max_cost=1.0)
    assert sweep_run_request(req, tmp_path).max_cost == 1.0  # the first run gets the whole budget
    _rented_run(tmp_path, "sweep-1x1", 0.30)
    _rented_run(tmp_path, "sweep-1x2", 0.25)
    _rented_run(tmp_path, "local-one", 5.0, provider="local")  # not a rented run: no cost of Vast's
    assert spent_under(tmp_path) == pytest.approx(0.55)
    assert sweep_run_request(req, tmp_path).max_cost == pytest.approx(0.45)
    _rented_run(tmp_path, "sweep-2x1", 0.45)
    with pytest.raises(DdpctlError, match=r"the sweep's --max-cost \$1 is spent \(\$1.0000 by its runs so far\)"):
        sweep_run_request(req, tmp_path)
    assert sweep_run_request(VastRequest(), tmp_path).max_cost is None  # no budget: nothing to share


def test_a_run_stopped_on_its_budget_says_so_in_its_summary(tmp_path):
    run_dir = RunDir.create(tmp_path, RunSpec(run_id="r"), {"provider": "vast"})
    (run_dir.path / "summary.json").write_text(json.dumps({"epochs": 3}))
    run_dir.update_record(max_cost_reached={"cost_usd": 0.34, "max_cost": 0.35})
    write_summary_cost(run_dir, 0.349)
    summary = json.loads((run_dir.path / "summary.json").read_text())
    assert summary["max_cost_reached"] == {"cost_usd": 0.34, "max_cost": 0.35} and summary["cost_usd"] == 0.349
