"""A Slurm run's saved plan (`up --provider slurm ... --dry-run --save-plan FILE`, then `up --plan FILE`): the spec,
the allocation asked, the login node and the exact submission (batch script and sbatch line). Run from the file,
the cluster is probed again and must give the very same batch script, byte for byte; that saved script is what is
submitted, so the job is exactly the plan that was saved (else a one-line refusal saying to make it again)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeGuard

import launcher
from launcher.errors import PlanError, SpecError
from launcher.planning.plan_file import PLAN_MAX_BYTES
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest
from launcher.spec.user_paths import read_user_file

KIND = "slurm"
VERSION = 1
MAKE_ONE = "make it again with `ddpctl up --provider slurm ... --dry-run --save-plan FILE`"


def plan_json(spec: RunSpec, request: SlurmRequest, login: str, submit: dict[str, Any]) -> dict[str, Any]:
    """What the file holds (JSON)."""
    slurm = asdict(request)
    slurm.update(sbatch_options=list(request.sbatch_options), prelude=list(request.prelude))
    return {"scheduled_plan_version": VERSION, "scheduler": KIND, "ddpctl": launcher.__version__, "login": login,
            "spec": spec.to_json(), "slurm": slurm, "submit": submit}


def is_scheduled_plan(data: object) -> TypeGuard[dict[str, Any]]:
    """Whether a plan file's JSON is a scheduler's plan (not a host plan)."""
    return isinstance(data, dict) and "scheduled_plan_version" in data


def read_scheduled_plan(path: Path, data: dict[str, Any]) -> tuple[RunSpec, SlurmRequest, str, str]:
    """(spec, request, login, the saved batch script) of a saved Slurm plan; PlanError naming the file otherwise."""
    if not isinstance(data.get("scheduled_plan_version"), int) or data["scheduled_plan_version"] > VERSION:
        raise PlanError(f"--plan {path}: written by a newer ddpctl ({data.get('ddpctl')}): use that version, or "
                        f"{MAKE_ONE}")
    try:
        if data["scheduler"] != KIND:
            raise ValueError(f"scheduler {data['scheduler']!r}")
        spec = RunSpec.from_json(data["spec"])
        slurm = dict(data["slurm"])
        request = SlurmRequest(**{**slurm, "sbatch_options": tuple(slurm.get("sbatch_options") or ()),
                                  "prelude": tuple(slurm.get("prelude") or ())})
        login, script = str(data["login"]), data["submit"]["script"]
        if not isinstance(script, str) or not login:
            raise ValueError("no batch script or login node")
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"--plan {path}: not a Slurm plan ddpctl can read ({e}): {MAKE_ONE}") from None
    if data["submit"].get("unknown"):
        raise PlanError(f"--plan {path}: the plan was made without asking the cluster (--no-probe), and a plan with "
                        f"unknowns never runs: {MAKE_ONE} (without --no-probe)")
    if spec.withheld_env:
        raise PlanError(f"--plan {path}: the plan holds no values for --env {', '.join(spec.withheld_env)}")
    return spec, request, login, script


def load_json(path: Path) -> object:
    """The file's JSON, or None when it cannot be read as JSON (the host plan reader then says why)."""
    try:  # bounded, a regular file: load_plan then names what else it is
        return json.loads(read_user_file(path, "--plan", PLAN_MAX_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, SpecError):
        return None
