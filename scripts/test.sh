#!/usr/bin/env bash
# The full check: set up, lint, type-check, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check hpc_train tests
.venv/bin/ruff format --check hpc_train tests
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
