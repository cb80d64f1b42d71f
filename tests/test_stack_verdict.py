"""The parser of faulthandler's dumps and the verdict, on real dumps: tests/data/stacks/*.json are the answers of
launcher/remote/rank_stacks.py taken from torchrun runs of tests/data/stacks/hang_cases.py with the join hook
(HANG_CASE=collective on 4 ranks, exited and loader on 2; torch 2.13 CPU, Python 3.11); the *.txt files are single
ranks' dumps of other runs (a barrier and a broadcast beside a started thread, DDP's backward)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.results.stack_verdict import (
    RankStacks,
    main_thread,
    parse_dump,
    place_of,
    ranks_from_answer,
    verdict,
)

DATA = Path(__file__).parent / "data" / "stacks"


def answer(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def said(name: str, world: int) -> str:
    found = answer(name)
    return verdict(ranks_from_answer(0, found), found["lines"], world)


def test_a_rank_that_never_reaches_the_collective_is_named_with_its_line() -> None:
    line = said("collective", 4)
    assert line == ("ranks 0, 2, 3 wait in all_reduce (hang_cases.py:42 in main: `dist.all_reduce(total)`); "
                    "rank 1 is elsewhere, at hang_cases.py:40 in main: `time.sleep(3600)  # rank 1 never reaches the "
                    "all-reduce`: the ranks are not in the same collective")


def test_a_rank_stuck_in_its_data_loader_worker_is_told_with_the_workers_frame() -> None:
    line = said("loader", 2)
    assert line.startswith("rank 0 waits in backward, where DDP all-reduces the gradients (hang_cases.py:27 in step")
    assert ("rank 1 waits for data loading (hang_cases.py:44 in main: `for batch in DataLoader(" in line
            and "its DataLoader worker is at hang_cases.py:22 in __getitem__: `time.sleep(3600)" in line), line
    assert line.endswith(": the ranks are not in the same collective")


def test_a_rank_that_exited_is_named_as_an_exit_not_a_hang() -> None:
    line = said("exited", 2)
    assert line.startswith("rank 0 waits in the rendezvous, init_process_group (hang_cases.py:35 in main")
    assert "rank 1 has exited (its process is gone)" in line
    assert line.endswith("the others wait for a rank that has exited (not a hang of the collective)")
    assert "sitecustomize" not in line  # the join hook's own wrapper is not the user's code


def test_ranks_that_never_registered_are_named_from_the_world_size() -> None:
    found = answer("collective")
    only_two = [r for r in ranks_from_answer(0, found) if r.rank in (0, 1)]
    line = verdict(only_two, found["lines"], 4)
    assert "ranks 2, 3 registered no stack dump" in line, line


def test_the_main_thread_is_found_beside_a_started_thread() -> None:
    threads = parse_dump((DATA / "barrier-with-thread-rank-0.txt").read_text())
    assert len(threads) == 2 and [t.current for t in threads] == [False, True]
    assert threads[0].frames[-1].function == "_bootstrap"
    main = main_thread(threads)
    assert main is threads[1]
    assert [f.short for f in main.frames][2:] == ["cases.py:26 in train", "cases.py:35 in main",
                                                 "cases.py:36 in <module>"]
    assert place_of(main.frames).kind == "collective" and place_of(main.frames).what == "barrier"


def test_ranks_in_two_different_collectives_are_not_in_the_same_one() -> None:
    ranks = [RankStacks(0, 0, "dumped", (DATA / "barrier-with-thread-rank-0.txt").read_text()),
             RankStacks(1, 1, "dumped", (DATA / "broadcast-with-thread-rank-1.txt").read_text())]
    line = verdict(ranks, {}, 2)
    assert line == ("rank 0 waits in barrier (cases.py:26 in train); rank 1 waits in broadcast (cases.py:28 in "
                    "train): the ranks are not in the same collective")


def test_every_rank_in_one_collective_says_that_collective_does_not_complete() -> None:
    dump = (DATA / "ddp-backward-rank-0.txt").read_text()
    line = verdict([RankStacks(0, 0, "dumped", dump), RankStacks(1, 1, "dumped", dump)], {}, 2)
    assert line.startswith("ranks 0, 1 wait in backward, where DDP all-reduces the gradients (cases.py:18 in train)")
    assert line.endswith("every rank is in the same collective and it does not complete (the network between the "
                         "nodes, or a process outside this run)")


def test_dump_lines_the_parser_does_not_know_are_skipped() -> None:
    text = ("Thread 0x00007f0000000001 [worker] (most recent call first):\n"
            "  <no Python frame>\n\n"
            "Current thread 0x00007f0000000002 (most recent call first):\n"
            '  File "/work/x.py", line 3 in f\n  ...\n'
            '  File "/work/x.py", line 9 in <module>\n'
            "garbage\n")
    threads = parse_dump(text)
    assert [t.ident for t in threads] == ["0x00007f0000000001", "0x00007f0000000002"]
    assert threads[0].frames == () and [f.line for f in threads[1].frames] == [3, 9]
    assert parse_dump("") == [] and parse_dump("not a dump\n") == []


def test_ranks_without_a_dump_say_why() -> None:
    line = verdict([RankStacks(0, 0, "no handler"), RankStacks(1, 0, "exited")], {}, None)
    assert line == "rank 0 gave no stacks (no handler); rank 1 has exited (its process is gone)"
    assert verdict([], {}, None).startswith("no rank registered for stack dumps")


def test_a_malformed_answer_gives_no_ranks_rather_than_a_crash() -> None:
    assert ranks_from_answer(0, {"ranks": [{"rank": "x"}, 5, {"rank": 1, "workers": [3]}]}) == [
        RankStacks(1, 0, "no dump", "", ())]


def test_a_source_line_with_control_characters_is_shown_without_them() -> None:
    dump = 'Current thread 0x1 (most recent call first):\n  File "/w/t.py", line 3 in main\n'
    line = verdict([RankStacks(0, 0, "dumped", dump)], {"/w/t.py:3": "time.sleep(9)  # \x1b[31mred\x07"}, 1)
    assert line == "rank 0 is elsewhere, at t.py:3 in main: `time.sleep(9)  # [31mred`"
