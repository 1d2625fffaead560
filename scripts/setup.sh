#!/usr/bin/env bash
# Create .venv and install hpc_train with its dev tools. torch 2.13.0 (the CPU build on these machines) goes in
# first when torch is missing, so no resolver ever picks an unpinned torch and pulls GBs of CUDA packages.
# --test also installs the `test` extra (transformers, lightning, scvi-tools: the third-party trainers the
# integration tests run), with torch held at the installed version so that no dependency can swap it.
#
# Speed (a clean clone, 2 cores): torch comes from pip, which reads this machine's pip configuration (where the
# CPU wheel is); the rest goes through uv, which resolves, unpacks and byte-compiles in parallel. Without uv (it
# could not be installed), pip does the same, slower. Byte-code is compiled at install on purpose: these
# machines set PYTHONDONTWRITEBYTECODE=1, so a module without a .pyc is compiled again by every process that
# imports it (each rank compiling torch._dynamo and sympy took over 10 s, and a watchdog test fired).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${HPC_TRAIN_TORCH_VERSION:-2.13.0}
extras=dev
[ "${1:-}" = --test ] && extras=dev,test
pip=(.venv/bin/python -m pip install -q)

# The interpreter .venv is made from: $PYTHON when set; else the distribution's /usr/bin/python3 when it is 3.10 or
# newer and can make a venv; else the first python3 on PATH. A distribution's build is optimized (profile-guided and
# link-time, libpython linked into the executable); a pyenv build is not by default. On these machines Debian's
# 3.11 imports torch and torch._dynamo in 3.8-4.2 CPU-s against 4.9-5.3 for pyenv's 3.11 (and runs plain Python
# about 20% faster): every launcher, supervisor and rank of the test suite pays that.
if [ ! -x .venv/bin/python ]; then
    if [ -n "${PYTHON:-}" ]; then
        "$PYTHON" -m venv .venv
    elif ! { /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null &&
        /usr/bin/python3 -m venv .venv 2>/dev/null; }; then
        rm -rf .venv  # a half-made one (Debian without python3-venv makes the folder, then fails)
        echo "setup: /usr/bin/python3 cannot make a venv here; making .venv from $(command -v python3)" >&2
        python3 -m venv .venv
    fi
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION"
    "${pip[@]}" "torch==$TORCH_VERSION"
fi
.venv/bin/python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > .venv/torch-constraint.txt
if [ -x .venv/bin/uv ] || "${pip[@]}" uv; then
    .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -c .venv/torch-constraint.txt -e ".[$extras]"
else
    echo "setup: uv could not be installed; pip installs the rest (slower)" >&2
    "${pip[@]}" -c .venv/torch-constraint.txt -e ".[$extras]"
fi
# The checkout's own modules too: an editable install compiles none of them, and every launcher, supervisor and
# rank (about a thousand processes in the test suite) compiled hpc_train's sources again (0.1 s each). A .pyc
# whose source changed later is not used: Python checks it against the source (its time and size).
.venv/bin/python -m compileall -q hpc_train hydra_plugins
echo "setup: ready ($(.venv/bin/python -c 'import sys, torch; print("Python", sys.version.split()[0], "from", getattr(sys, "_base_executable", "?"), "torch", torch.__version__)'), extras $extras)"
