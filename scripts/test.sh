#!/usr/bin/env bash
# The full check: set up, lint, type-check, start the Slurm testbed, run every test (unit, local multi-process
# runs, real-Slurm integration). Extra arguments go to pytest.
#
# What does not depend on each other overlaps: the testbed's apt packages install while pip sets up .venv, and
# the testbed's jobs run while the unit tests and the local runs run beside them (the testbed's jobs wait on
# Slurm a good part of the time; with the local side's two xdist workers, both cores stay busy).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
logs=$(mktemp -d)

# The integration tests need the testbed (root, apt). Start it here, and stop it afterwards if we started it.
# Slurm 24.11 (issue 57) installs beside it now; it runs after the 22.05 suite, on the same nodes.
testbed_pid=
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (
        slurm/testbed.sh install
        HPC_TESTBED_SLURM=24.11 slurm/testbed.sh install
        if ! sinfo -h -o %T 2>/dev/null | grep -q idle; then
            slurm/testbed.sh start && touch "$logs/started"
        fi
    ) >"$logs/testbed.log" 2>&1 &
    testbed_pid=$!
else
    echo "test: not root or no apt-get: the Slurm integration tests will be skipped" >&2
fi
local_pid=
mypy_pid=
finish() {
    local code=$?
    [ -n "$mypy_pid" ] && kill "$mypy_pid" 2>/dev/null || true
    [ -n "$local_pid" ] && { pkill -TERM -P "$local_pid"; kill "$local_pid"; } 2>/dev/null || true
    [ -n "$testbed_pid" ] && wait "$testbed_pid" 2>/dev/null || true
    [ -f "$logs/started" ] && slurm/testbed.sh stop || true
    [ -f "$logs/started-24.11" ] && HPC_TESTBED_SLURM=24.11 slurm/testbed.sh stop || true
    rm -rf "$logs"
    exit "$code"
}
trap finish EXIT

scripts/setup.sh --test
.venv/bin/ruff check hpc_train hydra_plugins tests benchmarks conf
.venv/bin/ruff format --check hpc_train hydra_plugins tests benchmarks conf
# mypy (80 s cold) runs beside what follows: waiting for the testbed, then the tests; its verdict comes at the end.
.venv/bin/mypy >"$logs/mypy.log" 2>&1 &
mypy_pid=$!
echo "test: set up and linted in $((SECONDS - t0))s"

if [ -n "$testbed_pid" ]; then
    testbed=0
    wait "$testbed_pid" || testbed=$?
    testbed_pid=
    cat "$logs/testbed.log"
    [ "$testbed" = 0 ] || { echo "test: the Slurm testbed did not start (status $testbed)" >&2; exit "$testbed"; }
fi

# Every test by default; arguments replace that. The testbed's jobs run one test at a time (they share one
# cluster); beside them, the local runs and the unit tests on two pytest-xdist workers, a module to a worker
# (module fixtures are built once), the longest modules first (tests/conftest.py). Three streams keep both cores
# busy (99% over the test phase, measured); with the local runs one at a time, the end of the suite ran on one
# core (the wheel test's pip, a launcher composing) about half the time. The local side's output follows the
# testbed's.
if [ $# -gt 0 ]; then
    .venv/bin/python -m pytest --durations=25 -n 0 "$@"
else
    .venv/bin/python -m pytest --durations=40 -n 2 --dist loadscope tests --ignore=tests/integration \
        >"$logs/local.log" 2>&1 &
    local_pid=$!
    integration=0
    .venv/bin/python -m pytest --durations=40 -n 0 tests/integration || integration=$?
    echo "test: integration tests done at $((SECONDS - t0))s"
    # The Slurm behaviours hpc_train relies on (the tests marked `generations`), again on Slurm 24.11: the 22.05
    # testbed stops (the two share nodes, ports and munge) and the 24.11 one starts. Only where this script
    # started the testbed: one a user runs is left alone.
    if [ -f "$logs/started" ]; then
        slurm/testbed.sh stop && rm "$logs/started"
        touch "$logs/started-24.11"
        HPC_TESTBED_SLURM=24.11 slurm/testbed.sh start || integration=$?
        .venv/bin/python -m pytest --durations=20 -n 0 --slurm 24.11 -m generations tests/integration ||
            integration=$?
        echo "test: integration tests on Slurm 24.11 done at $((SECONDS - t0))s"
    fi
    beside=0
    wait "$local_pid" || beside=$?
    local_pid=
    echo "---- unit tests and local runs (beside the integration tests) ----"
    cat "$logs/local.log"
    failed=
    [ "$integration" = 0 ] && [ "$beside" = 0 ] || failed="integration tests: status $integration; unit tests and local runs: status $beside"
fi
mypy=0
wait "$mypy_pid" || mypy=$?
mypy_pid=
cat "$logs/mypy.log"
[ "$mypy" = 0 ] || failed="${failed:+$failed; }mypy: status $mypy"
[ -z "${failed:-}" ] || { echo "test: failed ($failed)" >&2; exit 1; }
echo "test: finished in $((SECONDS - t0))s"
