"""`up --provider vast --interruptible`: one run over as many sets of machines as the market takes. Each set trains
with its outputs pulled as they are written (launcher/places/vast/live_pull.py) and its machines' states
watched (launcher/places/vast/interruptible.py); when one is outbid or lost, the survivors are stopped and
pulled, the whole set destroyed, a new set rented (launcher/places/vast/interruptible_provider.py), the newest
snapshot (a script: its out/) put on it, and every rank started again from there. run.json, summary.json, `status`
and the summary keep one run, with an `interruptions` list: what was lost, the time from the loss to training again,
and what it cost (from the ledger)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, RunStopRequested
from launcher.places.vast.interruptible import (
    MAX_INTERRUPTIONS,
    NODE_LOST,
    LossWatch,
    interruption_cost,
    mark_stopped,
    tell_interruption,
)
from launcher.places.vast.interruptible_provider import InterruptibleVastProvider
from launcher.places.vast.ledger import say
from launcher.places.vast.live_pull import LivePull
from launcher.places.vast.resume_files import ship_resume_files
from launcher.results.rundir import read_json, write_json_atomic
from launcher.transport.hostsession import HostSession

if TYPE_CHECKING:
    from launcher.planning.plan import RunPlan
    from launcher.planning.request import UpOptions, UpResult
    from launcher.providers.base import AcquiredHosts
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

Lost = tuple[dict[int, dict[str, Any]], float]  # node -> what the API showed; when ddpctl saw it


def run_interruptible(spec: RunSpec, options: UpOptions, saved: RunPlan | None = None) -> UpResult:
    """Rent bid machines and run on them; replace lost ones and resume, until the run ends (see the module)."""
    from launcher.execute.up import executor_calls, run_on_provider

    provider = InterruptibleVastProvider(options, executor_calls())
    if options.dry_run:
        return run_on_provider(provider, spec, options, saved)
    try:
        acquired = provider.acquire(spec, options)
        chain = Chain(provider, acquired)
        while True:
            result, lost = chain.attempt(acquired, saved if not chain.entries else None)
            if lost is None:
                assert result is not None
                return chain.finish(provider.release(result))
            acquired = chain.resume(*lost)
    except BaseException as exc:
        provider.release_after_failure(exc)
        raise
    finally:
        provider.close()


class Chain:
    """The sets of machines of one run, and the interruptions between them (run.json `interruptions`)."""

    def __init__(self, provider: InterruptibleVastProvider, acquired: AcquiredHosts) -> None:
        assert acquired.run_dir is not None
        self.provider, self.run_dir = provider, acquired.run_dir
        self.spec, self.options = acquired.spec, provider.options
        self.entries: list[dict[str, Any]] = []
        self.resumed_at: tuple[int, int] | None = None  # (epoch, step) the current set resumed from

    def attempt(self, acquired: AcquiredHosts, saved: RunPlan | None) -> tuple[UpResult | None, Lost | None]:
        """Run on this set; (result, None) when it ended without a loss, (None, lost) when a machine was lost."""
        from launcher.execute.up import run_acquired

        session = acquired.session
        assert session is not None
        follower = LivePull(HostSession(session.targets, session.options, settings=session.settings_json()),
                            self.run_dir, self.spec.python, self.resumed_at)

        def follow() -> None:
            follower.start()
            self._training_again(follower.training_seen_at)

        watch = LossWatch(cost=acquired.watch or (lambda: ""), check=self.provider.lost, follow=follow)
        try:
            result = run_acquired(replace(acquired, watch=watch), saved)
        except RunStopRequested as exc:
            if exc.reason != NODE_LOST or watch.lost is None or watch.detected_at is None:
                raise
            return None, (watch.lost, watch.detected_at)
        except DdpctlError:  # a failure that a lost machine explains is an interruption too
            lost = self._lost_now()
            if not lost:
                raise
            return None, (lost, time.time())
        finally:
            follower.stop()
            self._training_again(follower.training_seen_at, final=True)
        lost = self._lost_now() if result.exit_code != 0 else {}
        return (None, (lost, time.time())) if lost else (result, None)

    def _lost_now(self) -> dict[int, dict[str, Any]]:
        try:
            return self.provider.lost()
        except DdpctlError:
            return {}

    def resume(self, lost: dict[int, dict[str, Any]], detected_at: float) -> AcquiredHosts:
        """Record the loss, destroy the set, rent a new one, put the files to resume from on it."""
        ledger = self.provider._ledger
        assert ledger is not None
        if len(self.entries) >= MAX_INTERRUPTIONS:
            raise DdpctlError(f"run {self.run_dir.run_id} lost machines {len(self.entries) + 1} times in a row; given "
                              "up (the market outbids this bid): raise --bid or rent on demand")
        mark_stopped(ledger, lost, detected_at)
        text = "; ".join(f"node {n} (vast:{v['instance_id']}, machine {v['machine_id']}): {v['reason']}"
                         for n, v in sorted(lost.items()))
        entry: dict[str, Any] = {"index": len(self.entries) + 1, "lost": {str(n): v for n, v in lost.items()},
                                 "lost_text": text, "detected_at": detected_at}
        self.entries.append(entry)
        self._save()
        say(f"lost {text}; destroying the set, renting a new one and resuming", style="yellow")
        self.run_dir.event("vast.interrupted", index=entry["index"], lost=entry["lost"])
        self.provider.destroy_current("interrupted")
        acquired = self.provider.rent_again(self.spec, self.options, entry["index"])
        assert acquired.session is not None
        said, epoch = ship_resume_files(acquired.session, self.run_dir, self.spec.python,
                                        script=bool(self.spec.user_command))
        entry.update(resumed_from=said, resumed_epoch=epoch, snapshot_pulled_at=_pulled_at(self.run_dir, epoch),
                     instances=[int(i) for i in self.provider.current().values()])
        _set_aside(self.run_dir, entry["index"])
        self.resumed_at = (epoch + 1, 0) if epoch is not None else None
        self._save()
        return acquired

    def _training_again(self, seen_at: float | None, final: bool = False) -> None:
        """The latest interruption ends when the new set is seen training (a script: when its nodes started)."""
        entry = self.entries[-1] if self.entries else None
        if entry is None or "training_again_at" in entry:
            return
        measured_to = "a training step after resuming"
        if seen_at is None and (self.spec.user_command or final):
            started = [e for e in self.run_dir.events() if e.get("event") == "started"
                       and float(e.get("time") or 0) > entry["detected_at"]]
            seen_at = float(started[0]["time"]) if started else None
            measured_to = "the nodes started again"
        if seen_at is None:
            return
        ledger = self.provider._ledger
        assert ledger is not None
        entry.update(training_again_at=seen_at, measured_to=measured_to,
                     seconds_to_training=round(seen_at - entry["detected_at"], 3),
                     **interruption_cost(ledger.instances, entry.get("snapshot_pulled_at"), entry["detected_at"],
                                         seen_at))
        self._save()
        tell_interruption(entry)

    def _save(self) -> None:
        self.run_dir.update_record(interruptions=self.entries)

    def finish(self, result: UpResult) -> UpResult:
        """The interruptions into summary.json and the summary (costs as the ledger measured them)."""
        told = {"interruptions": len(self.entries), "interruption_details": self.entries,
                "interruptions_cost_usd": round(sum(float(e.get("cost_usd") or 0.0) for e in self.entries), 6)}
        path = self.run_dir.path / "summary.json"
        summary = read_json(path)
        if isinstance(summary, dict):
            write_json_atomic(path, {**summary, **told})
        if result.summary is None:
            return result
        return replace(result, summary={**result.summary, **told})


def _set_aside(run_dir: RunDir, index: int) -> None:
    """The lost set's pulled files (nodes/, live/) go to interrupted/<index>/: the next set's pulls start clean, so
    that its logs and the world it measures are not mixed with the lost set's (kept for reading)."""
    kept = run_dir.path / "interrupted" / str(index)
    kept.mkdir(parents=True, exist_ok=True)
    for name in ("nodes", "live"):
        if (run_dir.path / name).exists():
            (run_dir.path / name).rename(kept / name)


def _pulled_at(run_dir: RunDir, epoch: int | None) -> float | None:
    """When ddpctl first had the snapshot of `epoch` (its first live pull; None if unknown)."""
    if epoch is None:
        return None
    name = f"snapshot-epoch-{epoch:06d}.pt"
    for event in run_dir.events():
        if event.get("event") == "vast.live_pulled" and name in (event.get("snapshots") or []):
            return float(event["time"]) if "time" in event else None
    return None
