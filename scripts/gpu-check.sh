#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): every GPU figure docs/performance.md quotes, in one command that fits a
# device lease.
#
#   scripts/gpu-check.sh --prepare        here: the wheels of our dependencies that the GPU image lacks, into .whl/
#                                         (git ignores it; the device tool's run carries it: carry [".whl"])
#   scripts/gpu-check.sh OUT [ARGS...]    on the GPU machine: .whl/ installed into a temporary folder, then
#                                         scripts/gpu_check.py OUT ARGS (--budget S, --smoke)
#
# The GPU image has torch, Lightning, pytest and pytest-xdist; it lacks submitit, Hydra, OmegaConf (with antlr4)
# and python-hostlist, all pure Python. The checkout itself is on PYTHONPATH, as the tests run it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(submitit==1.5.4 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 python-hostlist==2.3.0)

if [ "${1:-}" = --prepare ]; then
    rm -rf .whl
    # Built here rather than downloaded: antlr4-python3-runtime and python-hostlist come as sources only. Each is
    # pure Python (py3-none-any), so it installs on the image's Python 3.12 as it is.
    "${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps -w .whl "${WHEELS[@]}"
    ls .whl
    exit 0
fi

out=${1:?usage: scripts/gpu-check.sh --prepare | scripts/gpu-check.sh OUT [--budget S] [--smoke]}
shift
python=${PYTHON:-python3}
site=
if compgen -G '.whl/*.whl' >/dev/null; then
    # A folder of this run's own: two checks at once (the tests run two) must not install into the same one.
    site=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
    trap 'rm -rf "$site"' EXIT
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
fi
export PYTHONPATH=${site:+$site:}$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
"$python" scripts/gpu_check.py "$out" "$@"
