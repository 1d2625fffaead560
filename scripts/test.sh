#!/usr/bin/env bash
# The full check: set up, lint, type-check, start the Slurm testbed, run every test (unit, local multi-process
# runs, real-Slurm integration). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
scripts/setup.sh --test
.venv/bin/ruff check hpc_train hydra_plugins tests benchmarks conf
.venv/bin/ruff format --check hpc_train hydra_plugins tests benchmarks conf
.venv/bin/mypy

# The integration tests need the testbed (root, apt). Start it here, and stop it afterwards if we started it.
started_testbed=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    slurm/testbed.sh install
    if ! sinfo -h -o %T 2>/dev/null | grep -q idle; then
        slurm/testbed.sh start
        started_testbed=1
    fi
else
    echo "test: not root or no apt-get: the Slurm integration tests will be skipped" >&2
fi
stop_testbed() { [ "$started_testbed" = 1 ] && slurm/testbed.sh stop || true; }
trap stop_testbed EXIT

# Every test by default; arguments replace that. The unit tests run in parallel (pytest-xdist, as a plain
# `pytest` runs them); the local runs and the testbed's jobs one at a time: they share 2 cores and one cluster.
if [ $# -gt 0 ]; then
    .venv/bin/python -m pytest --durations=25 -n 0 "$@"
else
    .venv/bin/python -m pytest tests/unit
    .venv/bin/python -m pytest --durations=25 -n 0 tests --ignore=tests/unit
fi
echo "test: finished in $((SECONDS - t0))s"
