"""The Vast.ai API contract as the stand-in enforces it: request schemas from the official OpenAPI files and
documented example bodies (verbatim copies in infra/vast_api/, provenance in its SOURCES.md)."""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

API_DIR = Path(os.environ.get("DDPCTL_VAST_API_DIR") or Path(__file__).with_name("vast_api"))

# Overlay networks have no OpenAPI entry; these schemas are the request shapes vast-cli sends
# (vastai/api/clusters.py, see SOURCES.md), made strict so a wrong field name fails.
_OVERLAY_SCHEMAS: dict[str, dict[str, Any]] = {
    "POST": {"type": "object", "required": ["cluster_id", "name"], "additionalProperties": False,
             "properties": {"cluster_id": {"type": "integer"}, "name": {"type": "string", "minLength": 1}}},
    "PUT": {"type": "object", "required": ["name", "instance_id"], "additionalProperties": False,
            "properties": {"name": {"type": "string", "minLength": 1}, "instance_id": {"type": "integer"}}},
    "DELETE": {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
               "properties": {"overlay_id": {"type": "integer"}, "overlay_name": {"type": "string"}}},
}


@dataclass(frozen=True)
class Operation:
    """One documented method + path: its body schema (None: no body) and query parameter schemas."""

    name: str  # the yaml file's stem, also the examples' prefix
    method: str
    template: str
    pattern: re.Pattern[str]
    body_schema: dict[str, Any] | None
    query_params: dict[str, dict[str, Any]]
    input_limits: dict[str, Any]


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{[a-z_]+\}", r"(?P<id>[^/]+)", template) + "$")


@cache
def operations() -> tuple[Operation, ...]:
    """Every operation of the per-endpoint OpenAPI files, plus the overlay endpoints."""
    ops: list[Operation] = []
    for path in sorted(API_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for template, methods in doc["paths"].items():
            for method, op in methods.items():
                body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
                if body is not None:
                    body = _patched(path.stem, copy.deepcopy(body))
                query = {p["name"]: p.get("schema", {}) for p in op.get("parameters", []) if p["in"] == "query"}
                ops.append(Operation(path.stem, method.upper(), template, _pattern(template), body, query,
                                     doc.get("x-input-validation", {})))
    for method, schema in _OVERLAY_SCHEMAS.items():
        ops.append(Operation("overlay", method, "/api/v0/overlay/", _pattern("/api/v0/overlay/"), schema, {}, {}))
    ops.append(Operation("overlay", "GET", "/api/v0/overlay/", _pattern("/api/v0/overlay/"), None, {}, {}))
    return tuple(ops)


def _patched(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Two documented contradictions resolved: search's `type` enum says "ondemand" while the same file's request
    example (and vast-cli, and the live service) use "on-demand"; the create's `env` is a string in the OpenAPI
    file, while Vast's "creating instances" guide, its multi-node guide and vast-cli send a JSON object of
    strings ({"-p 22:22": "1", "-n NET": "1", "VAR": "value"}); accept both forms of each."""
    if name == "search_offers":
        schema["properties"]["type"]["enum"].append("on-demand")
    if name == "create_instance" and "env" in schema.get("properties", {}):
        string_form = schema["properties"]["env"]
        schema["properties"]["env"] = {"anyOf": [string_form, {"type": "object",
                                                               "additionalProperties": {"type": "string"}}]}
    return schema


def find_operation(method: str, path: str) -> tuple[Operation, str | None] | None:
    """The operation serving `method path` and its path id, or None when undocumented."""
    for op in operations():
        m = op.pattern.match(path)
        if op.method == method and m:
            return op, m.groupdict().get("id")
    return None


def validate_request(op: Operation, body: Any, query: dict[str, str]) -> list[str]:
    """Every way the request breaks the documented contract (empty: valid)."""
    problems: list[str] = []
    if op.body_schema is None:
        if body is not None:
            problems.append(f"{op.method} {op.template} takes no body")
    elif body is None:
        problems.append(f"{op.method} {op.template} needs a JSON body")
    else:
        validator = jsonschema.Draft7Validator(op.body_schema)
        problems += [f"body{_where(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
        problems += _input_limits(op.input_limits, body)
    for name, value in query.items():
        if name == "api_key":
            problems.append("the API key belongs in the Authorization header, not the URL")
        elif name not in op.query_params:
            problems.append(f"unknown query parameter {name!r}")
        elif op.query_params[name].get("type") == "integer":
            if not re.fullmatch(r"-?\d+", value):
                problems.append(f"query {name}={value!r} is not an integer")
            elif "maximum" in op.query_params[name] and int(value) > op.query_params[name]["maximum"]:
                problems.append(f"query {name}={value} exceeds {op.query_params[name]['maximum']}")
    return problems


def _where(path: Any) -> str:
    return "".join(f"[{p!r}]" for p in path)


def _input_limits(limits: dict[str, Any], body: Any) -> list[str]:
    """The x-input-validation limits that the schema itself does not state (lengths, minimum disk)."""
    out: list[str] = []
    if not isinstance(body, dict):
        return out
    for field, rule in limits.items():
        value = body.get(field)
        if isinstance(value, str) and "max_length" in rule and len(value) > rule["max_length"]:
            out.append(f"{field} is longer than {rule['max_length']}")
        if isinstance(value, dict):  # env's object form: each entry, and all of them together
            entries = [f"{k}{v}" for k, v in value.items()]
            if "max_length" in rule and any(len(e) > rule["max_length"] for e in entries):
                out.append(f"an entry of {field} is longer than {rule['max_length']}")
            if "max_total_length" in rule and sum(map(len, entries)) > rule["max_total_length"]:
                out.append(f"{field} is longer than {rule['max_total_length']} in all")
        if isinstance(value, (int, float)) and "min" in rule and value < rule["min"]:
            out.append(f"{field} {value} is below the minimum {rule['min']}")
    return out


@cache
def _example_text(name: str) -> str | None:
    path = API_DIR / "examples" / f"{name}.json"
    return path.read_text() if path.exists() else None


def example(name: str, **overrides: Any) -> dict[str, Any] | None:
    """A documented example body (e.g. "create_instance.put.410") with fields replaced, or None."""
    text = _example_text(name)
    if text is None:
        return None
    body = json.loads(text)
    if isinstance(body, dict):
        body.update(overrides)
    return body
