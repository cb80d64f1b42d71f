"""The plain log's event lines are for people: no Python list, dict, None, True or False in them; a pull that
brought nothing back does not say "results pulled and verified"; what the stall's stop and the run's last line
already carry (the stacks' verdict, a world that is not the planned one) is not said a second time."""

from __future__ import annotations

import re
from typing import Any

import pytest

from launcher.execute.following.plain_progress import describe_event

REPRS = re.compile(r"[\[\]{}]|\b(None|True|False)\b")


@pytest.mark.parametrize(("event", "line"), [
    ({"event": "finished", "exit_codes": [1, 1]}, "every node ended (exit statuses 1, 1)"),
    ({"event": "stopping", "nodes": [0, 2], "reason": "a node failed"}, "stopping node(s) 0, 2: a node failed"),
    ({"event": "pulled", "node": 0, "verified": 0, "not_pulled": []}, "node 0: nothing came back (no file to pull)"),
    ({"event": "pulled", "node": 1, "verified": 12}, "node 1: results pulled, 12 file(s) verified"),
    ({"event": "pull_failed", "node": 1, "error": "Server connection dropped: "},
     "node 1: pull failed: the SSH connection dropped (the host's sshd ended or the network failed)"),
    ({"event": "pull_failed", "node": 0, "error": ""}, "node 0: pull failed: no reason given"),
    ({"event": "pull_failed", "node": 0, "error": "u@h: timed out\n  after 60 s"},
     "node 0: pull failed: u@h: timed out after 60 s"),
])
def test_event_lines_name_values_not_reprs(event: dict[str, Any], line: str) -> None:
    said = describe_event({"time": 1.0, **event})
    assert said == line
    assert not REPRS.search(said), said


@pytest.mark.parametrize("event", [{"event": "stacks", "verdict": "rank 0 waits ...", "folder": "stacks/x"},
                                   {"event": "world_differs", "error": "the trainer ran on 1 node(s) ..."}])
def test_what_the_last_line_carries_is_not_said_twice(event: dict[str, Any]) -> None:
    assert describe_event({"time": 1.0, **event}) is None
