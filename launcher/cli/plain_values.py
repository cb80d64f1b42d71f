"""Option values read without pydantic: typer 0.29 turns every option's text into its value through a pydantic
TypeAdapter, and importing pydantic and building ~60 adapters is about a tenth of a second of every `ddpctl up`,
for values that are plain text, numbers, paths, flags and lists of text.

`use_plain_values()` gives typer's parameters of those types (str, int, float, bool, Path, list[str]; optional or
not) a coercion of their own that accepts and refuses what typer's does, with the same messages
(tests/test_plain_values.py compares the two on a table of inputs); any other type keeps typer's. It relies on
typer's parameter class asking `get_runtime_param()` for its coercion (typer >= 0.29): with a typer that does not,
nothing is changed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# pydantic's lax reading of text: ASCII digits, `_` between digits, surrounding blanks; an integer may end in `.0`.
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
INT_ERROR = "Input should be a valid integer, unable to parse string as an integer"
FLOAT_ERROR = "Input should be a valid number, unable to parse string as a number"
BOOL_ERROR = "Input should be a valid boolean, unable to interpret input"


def plain_int(value: Any) -> int:
    """An int option's value as typer (pydantic, lax) reads it; ValueError with its message otherwise."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("Input should be a valid integer, got a number with a fractional part")
        return int(value)
    text = value.strip() if isinstance(value, str) else None
    if text is None or not _INT_TEXT.fullmatch(text):
        raise ValueError(INT_ERROR)
    return int(text.split(".")[0])


def plain_float(value: Any) -> float:
    """A float option's value as typer (pydantic, lax) reads it; ValueError with its message otherwise."""
    if isinstance(value, bool | int | float):
        return float(value)
    text = value.strip() if isinstance(value, str) else ""
    try:
        if not text.isascii():  # Python reads other scripts' digits too; pydantic does not
            raise ValueError(FLOAT_ERROR)
        return float(text)
    except ValueError:
        raise ValueError(FLOAT_ERROR) from None


def plain_bool(value: Any) -> bool:
    """A flag's value given as text (a flag's own value is a bool already); ValueError with typer's message."""
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text == "" or text in _FALSE:
        return False
    if text in _TRUE:
        return True
    raise ValueError(BOOL_ERROR)


def plain_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    return value


READERS: dict[Any, Any] = {int: plain_int, float: plain_float, bool: plain_bool, str: plain_str}


def use_plain_values() -> bool:
    """Give typer's parameters of plain types the readers above; whether typer is one this applies to."""
    try:
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_path
        from typer.core import _TyperParameter
    except ImportError:
        return False
    original = getattr(_TyperParameter, "get_runtime_param", None)
    if original is None or getattr(original, "plain_values", False):
        return original is not None
    from dataclasses import dataclass

    from typer import BadParameter

    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """Coercion of one plain-typed parameter (RuntimeParam handles None and repeated values first)."""

        read: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                if self.read is list:
                    items = value if isinstance(value, list | tuple) else [value]
                    return [plain_str(item) for item in items]
                if self.read is Path:
                    path = value if isinstance(value, Path) else Path(plain_str(value))
                    return coerce_cli_path(path, self.parameter_info, path_type=Path, param=param, ctx=ctx)
                return self.read(value)
            except ValueError as e:
                raise BadParameter(str(e), ctx=ctx, param=param) from None

    def reader(annotation: Any, info: Any) -> Any:
        if info.parser is not None or info.min is not None or info.max is not None:
            return None
        if annotation == list[str]:
            return list
        if annotation is Path and not (info.exists or info.resolve_path or info.writable or info.allow_dash):
            return Path
        return READERS.get(annotation)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            descriptor = self.type_descriptor
            read = reader(descriptor.annotation, descriptor.parameter_info)
            if read is not None:
                self._runtime_param = PlainParam(parameter_info=descriptor.parameter_info,
                                                 annotation=descriptor.annotation, read=read)
        return self._runtime_param if self._runtime_param is not None else original(self)

    get_runtime_param.plain_values = True  # type: ignore[attr-defined]
    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]
    return True
