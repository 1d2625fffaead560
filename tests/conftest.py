"""Shared fixtures: the repo's conf/ folder and a helper that runs `python -m hpc_train` as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"


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
