#!/usr/bin/env bash
# Create .venv and install hpc_train with its dev tools. torch 2.13.0 (the CPU build on these machines) goes in
# first when torch is missing, so no resolver ever picks an unpinned torch and pulls GBs of CUDA packages.
# --test also installs the `test` extra (transformers, lightning, scvi-tools: the third-party trainers the
# integration tests run), with torch held at the installed version so that no dependency can swap it.
#
# Speed (a clean clone, 2 cores): pip byte-compiles every file it installs, most of which no run ever imports;
# --no-compile leaves that to the first import. torch itself comes from pip, which reads this machine's pip
# configuration (where the CPU wheel is); the rest goes through uv, which resolves and unpacks in parallel:
# 36 s instead of 191 s for `--test`. Without uv (it could not be installed), pip does the same, slower.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${HPC_TRAIN_TORCH_VERSION:-2.13.0}
extras=dev
[ "${1:-}" = --test ] && extras=dev,test
pip=(.venv/bin/python -m pip install -q --no-compile)

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION"
    "${pip[@]}" "torch==$TORCH_VERSION"
fi
.venv/bin/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > .venv/torch-constraint.txt
if [ -x .venv/bin/uv ] || "${pip[@]}" uv; then
    .venv/bin/uv pip install -q --python .venv/bin/python -c .venv/torch-constraint.txt -e ".[$extras]"
else
    echo "setup: uv could not be installed; pip installs the rest (slower)" >&2
    "${pip[@]}" -c .venv/torch-constraint.txt -e ".[$extras]"
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), extras $extras)"
