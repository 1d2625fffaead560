#!/usr/bin/env bash
# Create .venv and install hpc_train with its dev tools. torch 2.13.0 (the CPU build on these machines) goes in
# first when torch is missing, so pip never resolves an unpinned torch and pulls GBs of CUDA packages.
# --test also installs the `test` extra (transformers, lightning: the third-party trainers the integration
# tests run), with torch held at the installed version so that no dependency can swap it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${HPC_TRAIN_TORCH_VERSION:-2.13.0}
extras=dev
[ "${1:-}" = --test ] && extras=dev,test

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION"
    .venv/bin/python -m pip install -q "torch==$TORCH_VERSION"
fi
.venv/bin/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > .venv/torch-constraint.txt
.venv/bin/python -m pip install -q -c .venv/torch-constraint.txt -e ".[$extras]"
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), extras $extras)"
