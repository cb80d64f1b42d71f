"""`--prelude` lines cannot change the batch script around them: one complete line each (a trailing backslash, an
unclosed quote, a heredoc refused before submission), run in a block of their own (a single-quoted string checked
by `bash -n`, then eval'd in the script's shell), and the job's folder restored after a `cd`. The block is run by
real bash here, as the job's shell runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.places.slurm.prelude import prelude_lines
from launcher.spec.slurm_request import SlurmRequest


@pytest.mark.parametrize(("line", "words"), [
    ("module load cuda \\", "a trailing backslash continues the line"),
    ("set -e \\  ", "a trailing backslash"),
    ('echo "unclosed', "an unclosed quote"), ("echo 'unclosed", "an unclosed quote"),
    ("cat <<EOF", "a heredoc needs lines of its own"), ("cat <<-END > f", "a heredoc"),
    ("a\nb", "one shell line"), ("  ", "one shell line"),
])
def test_a_line_that_would_join_or_swallow_the_script_is_refused(line: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        SlurmRequest(prelude=(line,))
    assert str(caught.value).startswith(f"--prelude {line!r}: ") and words in str(caught.value)


@pytest.mark.parametrize("line", ["module load cuda/12.4", "conda activate env # it's mine", "cd /tmp",
                                  'export A="$(echo "a b")"', "cat <<<'here string'", "echo $'a\\'b'"])
def test_ordinary_lines_pass(line: str) -> None:
    assert SlurmRequest(prelude=(line,)).prelude == (line,)


def run_block(tmp_path: Path, prelude: tuple[str, ...], after: str) -> subprocess.CompletedProcess[str]:
    script = "\n".join(["#!/bin/bash", *prelude_lines(prelude), "set -e", after]) + "\n"
    (tmp_path / "job.sbatch").write_text(script)
    return subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.integration
def test_the_block_keeps_what_it_exports_and_restores_the_folder(tmp_path: Path) -> None:
    done = run_block(tmp_path, ("export LOADED=cuda", "cd /"), 'echo "$LOADED $PWD"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cuda {tmp_path}"


@pytest.mark.integration
def test_a_prelude_bash_cannot_parse_ends_the_job_before_any_of_it_runs(tmp_path: Path) -> None:
    done = run_block(tmp_path, ("touch ran-first", "if true; then"), "touch ran-after")
    assert done.returncode == 2
    assert "ddpctl: the --prelude lines are not valid shell (bash -n, above): the job ends" in done.stderr
    assert not (tmp_path / "ran-first").exists() and not (tmp_path / "ran-after").exists()


@pytest.mark.integration
def test_quotes_and_backslashes_in_the_prelude_stay_inside_it(tmp_path: Path) -> None:
    done = run_block(tmp_path, ("printf '%s\\n' \"it's\" 'a \"b\"'",), "echo after")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["it's", 'a "b"', "after"]
