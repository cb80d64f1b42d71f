#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, a Docker engine, lint, types, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh --test
bash infra/dockerd.sh
ruff check .
mypy launcher trainer
exec python3 -m pytest -q -ra "$@"
