"""One interruption of `ddpctl up --provider vast --interruptible` on the Vast.ai stand-in: a 2-node run whose node
0 machine is outbid once its first snapshot has been pulled; prints the seconds from the loss (as ddpctl saw it)
to training again on the new set, and what the interruption cost (from the run's ledger). The stand-in's machines
are this machine's network namespaces (renting and booting take well under a second; a real Vast.ai machine pulls
its image for minutes). Needs root (the test bed).

Usage: python bench/bench_interruption.py [--rounds 1]
Writes bench/results/interruption.json."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # infra/ is test support, not installed
from infra import vast_bids  # noqa: E402
from infra.testbed import Testbed, cleanup_stale  # noqa: E402
from infra.vast_standin import VastStandIn, make_offer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KEY = "bench-key"
ARGS = ["up", "--provider", "vast", "--image", "docker.io/ddpctl/trainer:bench", "--disk", "16", "--nodes", "2",
        "--gpus", "1", "--gpu-name", "RTX 3080", "--interruptible", "--down", "--json", "--epochs", "4",
        "--synthetic-train-size", "32768", "--synthetic-test-size", "128", "--batch-size", "32"]


def one_round(bed: Testbed, tmp: Path) -> dict:
    offers = [make_offer(k, 400 + k, dph_base=0.10 + 0.01 * k, cluster_id=9) for k in range(1, 5)]
    with VastStandIn(api_key=KEY, offers=offers, host_factory=lambda _iid: bed.add_host(22),
                     host_remover=bed.remove_host, boot_delay_s=0.2) as standin:
        env = {**os.environ, "VAST_API_KEY": KEY, "DDPCTL_VAST_URL": standin.url, "HOME": str(tmp / "home"),
               "XDG_CONFIG_HOME": str(tmp / "config"), "DDPCTL_KNOWN_HOSTS": str(tmp / "known_hosts"),
               "PYTHONPATH": str(REPO)}
        runs = tmp / "runs"
        proc = subprocess.Popen([sys.executable, "-m", "launcher", *ARGS, "--runs-dir", str(runs)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 300
        while not list(runs.glob("*/live/0/out/snapshots/snapshot-epoch-*.pt")):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"no snapshot was pulled before the run ended: {proc.communicate()[1][-2000:]}")
            time.sleep(0.2)
        (run,) = list(runs.iterdir())
        record = json.loads((run / "run.json").read_text())
        node0 = next(i for i in record["instances"] if i["node"] == 0 and i["state"] == "rented")
        vast_bids.outbid(standin, int(node0["machine_id"]), 5.0)
        stdout, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(stderr[-2000:])
    for host in list(bed.hosts):
        bed.remove_host(host)
    (entry,) = json.loads((run / "run.json").read_text())["interruptions"]
    summary = json.loads(stdout)["summary"]
    lost = entry["detected_at"]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]

    def after(kind: str, last: bool = False, reason: str | None = None) -> float | None:
        times = [e["time"] - lost for e in events if e["event"] == kind and e["time"] > lost
                 and (reason is None or e.get("reason") == reason)]
        return round(times[-1] if last else times[0], 2) if times else None

    steps = {"set_destroyed_s": after("vast.instance_destroyed", True, "interrupted"),
             "new_set_ready_s": after("vast.instance_ready", last=True), "nodes_started_s": after("started"),
             "training_again_s": entry["seconds_to_training"]}
    return {"after_the_loss": steps, "measured_to": entry["measured_to"],
            "resumed_from": entry["resumed_from"], "cost_usd": entry["cost_usd"], "gap_usd": entry["gap_usd"],
            "redone_usd": entry["redone_usd"], "run_cost_usd": summary["cost_usd"], "epochs": summary["epochs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    rounds = parser.parse_args().rounds
    cleanup_stale("ddpbnb")
    results = []
    with Testbed("ddpbnb", n_hosts=0, host_python=True) as bed:
        for k in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                results.append(one_round(bed, Path(tmp)))
            print(f"round {k + 1}: {json.dumps(results[-1])}")
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "load": os.getloadavg(), "rounds": results}
    (REPO / "bench" / "results" / "interruption.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
