"""Launch options from a TOML file (`--config`), from a run's record (`--from`), and written back (`--save-config`).

Layers, lowest first: the declared defaults, the recorded run (`--from`), the config file, the command line.
Keys are the option names (`gpus = 2`, `host = ["a", "b"]`, `env = ["K=V"]`, `identity-file` or
`identity_file`); an unknown key or a value of the wrong kind is one line naming the file and the key."""

from __future__ import annotations

import difflib
import json
import math
import sys
from pathlib import Path
from typing import Any

from launcher.cli.options import LaunchOption
from launcher.errors import SpecError
from launcher.spec.user_paths import read_user_file

CONFIG_MAX_BYTES = 1 << 20  # a file of launch options is a few hundred bytes
COMMAND_KEY = "command"  # the key that holds `-- CMD ...` (what runs), beside the options

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def read_config(path: Path, declared: dict[str, LaunchOption]) -> dict[str, Any]:
    """The options of a TOML config file, checked against `declared`; SpecError naming the file otherwise."""
    try:
        # A FIFO would wait for ever, /dev/zero never end. utf-8-sig: a byte-order mark (some editors write one)
        # is not TOML, but it is not the user's mistake either.
        data = tomllib.loads(read_user_file(path, "--config", CONFIG_MAX_BYTES, "give a TOML file")
                             .decode("utf-8-sig"))
    except FileNotFoundError:
        raise SpecError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"--config {path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"--config {path}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib nests a call per level: thousands of nested arrays or tables
        raise SpecError(f"--config {path}: nested too deeply to be a file of launch options (options are "
                        "top-level keys)") from None
    return check_values(data, declared, f"--config {path}")


def check_values(data: dict[str, Any], declared: dict[str, LaunchOption], where: str) -> dict[str, Any]:
    """Option values by name, each of its option's kind; unknown keys refused with the closest valid one."""
    settable = {name: o for name, o in declared.items() if o.in_config}
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == COMMAND_KEY:  # `-- CMD ...`: what runs instead of ddpctl's trainer
            values[name] = _command(value, f"{where}: {key}")
            continue
        if name not in settable:
            close = difflib.get_close_matches(name, list(settable), n=1)
            hint = f"did you mean {close[0].replace('_', '-')!r}?" if close else "see `ddpctl up --help`"
            raise SpecError(f"{where}: unknown key {key!r}: {hint}")
        values[name] = _typed(settable[name], value, f"{where}: {key}")
    return values


def _typed(option: LaunchOption, value: Any, where: str) -> Any:
    """`value` as the option's Python value, or SpecError saying what kind was expected."""
    kind = option.kind
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str) and value != "",
        "repeated": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "choice": isinstance(value, str) and value in option.choices,
    }[kind]
    texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if ok and any("\x00" in text for text in texts):
        raise SpecError(f"{where} holds a NUL byte (\\0), which no path, argument or environment value can carry: "
                        "remove it")
    if not ok:
        want = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                "path": "a path (a non-empty string)", "repeated": 'a list of strings, e.g. ["a", "b"]',
                "choice": "one of " + ", ".join(repr(c) for c in option.choices)}[kind]
        shown = _toml_value(value) if _writable(value) else repr(value)
        raise SpecError(f"{where} = {shown}: expected {want}")
    if kind == "float":
        return float(value)
    if kind == "path":
        return Path(value)
    return list(value) if kind == "repeated" else value


def _command(value: Any, where: str) -> list[str]:
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v and "\x00" not in v for v in value)):
        raise SpecError(f"{where}: expected the command after `--` as a list of strings, e.g. "
                        '["python", "train.py"]')
    return list(value)


def _writable(value: Any) -> bool:
    if isinstance(value, list):
        return all(_writable(v) for v in value)
    return isinstance(value, bool | int | str | Path) or (isinstance(value, float) and math.isfinite(value))


def _toml_value(value: Any) -> str:
    """One value in TOML (the kinds options have: bool, int, float, string, path, list of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string (same escapes)


def config_text(values: dict[str, Any], declared: dict[str, LaunchOption]) -> str:
    """A config file holding `values` (those that differ from the defaults); --env values left out (secrets)."""
    lines = ["# ddpctl launch options: `ddpctl up --config THIS_FILE` (the command line overrides these)."]
    for name, option in declared.items():
        value = values.get(name)
        default = list(option.default) if option.type is list else option.default
        if not option.in_config or value is None or value == default:
            continue
        if name == "env":  # names only: `--config` takes each value from the shell that runs it (or --env)
            lines.append("# env: names only, the values are not written (they may be secrets); export them before "
                         "`ddpctl up --config`, or give them with --env NAME=VALUE")
            value = [item.partition("=")[0] for item in value]
        lines.append(f"{name.replace('_', '-')} = {_toml_value(value)}")
    if values.get(COMMAND_KEY):  # `-- CMD`: without it the file would plan ddpctl's trainer instead
        lines.append(f"{COMMAND_KEY} = {_toml_value(list(values[COMMAND_KEY]))}")
    return "\n".join(lines) + "\n"


def recorded_options(values: dict[str, Any], declared: dict[str, LaunchOption]) -> dict[str, Any]:
    """What run.json keeps of the launch options: JSON values, --env as names only."""
    kept: dict[str, Any] = {}
    for name, option in declared.items():
        value = values.get(name)
        if not option.in_config or value is None:
            continue
        if name == "env":
            kept["env_names"] = [item.partition("=")[0] for item in value]
            continue
        # Paths absolute, so that `up --from` finds the same files from any working directory.
        kept[name] = str(value.resolve()) if isinstance(value, Path) else list(value) if isinstance(value, tuple) \
            else value
    return kept
