"""Hints for options people bring from other launchers (torchrun, accelerate): `--nproc` means `--gpus` here, not
the closest spelling click would guess."""

from __future__ import annotations

from typing import Any

# Another launcher's option (lower case, `_` as `-`) -> the first flag it maps to (which the command must have for
# the hint to be given) and the hint's words.
BY_MEANING: dict[str, tuple[str, str]] = {
    **{name: ("--gpus", "--gpus (processes per node)") for name in (
        "--nproc", "--nproc-per-node", "--nprocs", "--num-gpus", "--ngpus", "--gpus-per-node", "--world-size",
        "--num-processes", "--nproc-per-host")},
    **{name: ("--host", "--nodes (Vast.ai machines) or one --host per node") for name in (
        "--nnodes", "--num-nodes", "--num-machines")},
    "--master-addr": ("--rdzv-addr", "--rdzv-addr"),
    "--main-process-ip": ("--rdzv-addr", "--rdzv-addr"),
    "--master-port": ("--rdzv-port", "--rdzv-port"),
    "--main-process-port": ("--rdzv-port", "--rdzv-port"),
    "--rdzv-endpoint": ("--rdzv-addr", "--rdzv-addr and --rdzv-port"),
    "--node-rank": ("--host", "the order of --host (node 0 first)"),
}


def _flags_of(command: Any) -> set[str]:
    return {flag for param in getattr(command, "params", ()) for flag in getattr(param, "opts", ())}


def hint_for(option_name: str, command: Any) -> str | None:
    """The option of `command` that `option_name` (an unknown option) means, in words; None if none is known."""
    key = option_name.split("=", 1)[0].lower().replace("_", "-")
    target = BY_MEANING.get(key)
    if target is None or target[0] not in _flags_of(command):
        return None
    return target[1]


def no_such_option_message(error: Exception) -> str | None:
    """click's "No such option" with our hint by meaning instead of its guesses by spelling; None when we have
    no hint (click's own message stands)."""
    option_name = getattr(error, "option_name", None)
    ctx = getattr(error, "ctx", None)
    if not option_name or ctx is None:
        return None
    hint = hint_for(option_name, ctx.command)
    if hint is None:
        return None
    return f"no such option: {option_name}; ddpctl {ctx.info_name} uses {hint} instead"
