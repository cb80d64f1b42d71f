#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, a Docker engine, lint, types, then pytest.
# pytest runs on DDPCTL_TEST_WORKERS pytest-xdist workers, 4 unless set (tests/worker_groups.py keeps what must
# share one worker together): on a 2-core machine 3 left the cores idle about 9 % of the time (tests waiting on
# Slurm's minutes, torchrun's timeouts, SSH), 4 keep them busy: 13 to 14 minutes where 3 took 14 to 16
# minutes for 1,244 tests, 17 to 18 for the 1,643 at 419d7aa, 18 for the 1,837 at 0f43ed3,
# 16 for the 1,856 at cfc2627, 15½ for the 1,854 at 717092c, 14½ for the 1,857 at b8df7f0, where 5 took 14 to
# 15 with more CPU (docs/performance.md); 0: one process. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python caches what it compiles (__pycache__/, ignored by git, Docker and shipping), as on a user's machine: a
# machine that forbids it (PYTHONDONTWRITEBYTECODE) would compile the launcher anew in each of the suite's ddpctl
# commands, about 0.1 s of CPU each, and pytest would rewrite every test module in every worker.
unset PYTHONDONTWRITEBYTECODE
bash infra/setup.sh --test
bash infra/dockerd.sh
source infra/pick_python.sh  # the python infra/setup.sh installed into
"$py" -m ruff check .
"$py" -m mypy launcher trainer
workers=${DDPCTL_TEST_WORKERS:-4}
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadgroup)
fi
exec "$py" -m pytest -q -ra --durations=30 "${parallel[@]}" "$@"  # the slowest tests, to keep the suite under 15 minutes
