#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, a Docker engine, lint, types, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh --test
bash infra/dockerd.sh
source infra/pick_python.sh  # the python infra/setup.sh installed into
"$py" -m ruff check .
"$py" -m mypy launcher trainer
exec "$py" -m pytest -q -ra --durations=30 "$@"  # the slowest tests, to keep the suite under 30 minutes
