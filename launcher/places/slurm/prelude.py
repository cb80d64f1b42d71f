"""The `--prelude` lines in the batch script, in a block of their own: kept as one single-quoted shell string, so
nothing in them (a trailing backslash, an unclosed quote, a heredoc opener) can join or swallow the script's own
lines; checked by `bash -n` before they run (a syntax error ends the job at once, saying so, instead of running
half of them); run in the script's shell by `eval` (what they load or export stays); then the job's folder again,
whatever they `cd`-ed to. SlurmRequest refuses the plain mistakes before submission
(launcher/spec/slurm_request.py's check_prelude_line)."""

from __future__ import annotations

import shlex


def prelude_lines(prelude: tuple[str, ...]) -> list[str]:
    """The batch script's lines for the prelude (none without one)."""
    if not prelude:
        return []
    return [
        "# --prelude: the cluster's own set-up (module load, conda activate), as a block of its own: checked by",
        "# bash -n, run in this shell, then back in the job's folder",
        "ddpctl_dir=$PWD",
        f"ddpctl_prelude={shlex.quote(chr(10).join(prelude))}",
        'if ! bash -n -c "$ddpctl_prelude"; then',
        '  echo "ddpctl: the --prelude lines are not valid shell (bash -n, above): the job ends" >&2; exit 2',
        "fi",
        'eval "$ddpctl_prelude"',
        'cd "$ddpctl_dir"',
    ]
