#!/usr/bin/env bash
# Create .venv and install hpc_train with its dev tools. torch 2.13.0 (the CPU build on these machines) goes in
# first when torch is missing, so no resolver ever picks an unpinned torch and pulls GBs of CUDA packages.
# --test also installs the `test` extra (transformers, lightning, scvi-tools: the third-party trainers the
# integration tests run), with torch held at the installed version so that no dependency can swap it.
#
# Speed (a clean clone, 2 cores): pip byte-compiles every file it installs, most of which no run ever imports;
# --no-compile skips that, and the modules runs do import are compiled once at the end. torch itself comes from pip, which reads this machine's pip
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
# Byte-code for what runs import, compiled once here rather than by every process that first imports it (the
# installs above skip it): a rank imports torch, torch._dynamo (any torch.optim optimizer does), DDP and
# TensorBoard; --test adds the frameworks and trackers the tests run. Four ranks compiling sympy at once took
# over 10 s on this machine, long enough for a 10-second watchdog to fire before the first step.
warm="import hpc_train.runtime.worker, hpc_train.train.trainer, torch._dynamo, torch.distributed.fsdp"
warm="$warm, torch.utils.tensorboard, matplotlib.pyplot, hydra, submitit"
[ "$extras" = dev,test ] && warm="$warm, transformers.trainer, lightning.pytorch, scvi, mlflow, wandb"
.venv/bin/python -W ignore -c "$warm" >/dev/null 2>&1 || .venv/bin/python -c "$warm"
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), extras $extras)"
