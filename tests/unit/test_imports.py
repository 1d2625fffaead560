"""Start-up cost: the launcher side of hpc_train must not import torch.

``import torch`` takes about a second on a small CPU node. The launcher (``python -m hpc_train``, the Hydra
launcher plugin, submission) only composes a config and starts ranks; each rank imports torch itself. When
issue 6 let a torch import slip into the launcher (through ``worker`` -> ``train.stopping``), every local run
reached its first step about a second later. This test keeps that from coming back.
"""

from __future__ import annotations

import subprocess
import sys

LAUNCHER_MODULES = [
    "hpc_train.__main__",
    "hpc_train.launch.local",
    "hpc_train.launch.slurm",
    "hpc_train.launch.sbatch",
    "hpc_train.launch.sweep",
    "hpc_train.worker",
    "hydra_plugins.hpc_train_launcher.launcher",
]


def test_launcher_modules_do_not_import_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {LAUNCHER_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "    if leaked:\n"
        "        sys.exit(f'{name} imported torch ({len(leaked)} torch modules, e.g. {leaked[:3]})')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
