"""Shared fixtures: the repo's conf/ folder and a helper that runs `python -m hpc_train` as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
"""hpc_train's own config groups, at the top of the repository; the wheel ships them as hpc_train/conf."""

gpu_test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
"""Marks a test that needs a GPU: skipped on CPU-only machines (CI), run with ``pytest -m gpu`` where one is."""


@pytest.fixture
def run_cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run ``python -m hpc_train <args>`` in a fresh run dir; returns (completed process, run dir)."""

    def run(*args: str, run_dir: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180):
        run_dir = run_dir or tmp_path / "run"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=tmp_path,
        )
        return proc, run_dir

    return run


def start_in_foreground(argv: list[str]) -> subprocess.Popen[str]:
    """Start a launcher the way a terminal starts a foreground command, so that a SIGINT (Ctrl-C) reaches it.

    A shell starts background jobs (`cmd &`, as CI may run the suite) with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored, so without this the launcher would never see the Ctrl-C.
    """
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def assert_bitwise_equal(a: Path, b: Path) -> None:
    """The final weights of two run directories are identical to the last bit (resume tests, local and Slurm)."""
    wa, wb = (torch.load(d / "model_final.pt", weights_only=True) for d in (a, b))
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{different} differ: max {max((wa[k] - wb[k]).abs().max().item() for k in different)}"
