#!/usr/bin/env bash
# The full check: set up, lint, type-check, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# scontrol lets the tests compare expand_hostlist with Slurm's own expansion.
if ! command -v scontrol >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test: installing slurm-client (scontrol)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-client >/dev/null
fi
.venv/bin/ruff check hpc_train tests
.venv/bin/ruff format --check hpc_train tests
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
