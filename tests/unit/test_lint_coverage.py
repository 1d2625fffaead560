"""ruff sees every Python file of the package: its default exclusions once hid hpc_train/dist/ (a folder named
dist, like a build output; now hpc_train/distributed/) from every lint and format run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_checks_every_python_file_of_the_package() -> None:
    folders = ["hpc_train", "hydra_plugins", "tests", "benchmarks"]
    shown = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", *folders],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    seen = {Path(p).resolve() for p in shown if p.endswith(".py")}
    ours = {p.resolve() for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}
    assert ours - seen == set(), sorted(str(p.relative_to(ROOT)) for p in ours - seen)
    assert any(p.parent.name == "distributed" for p in seen)
    # The alias module hpc_train/dist.py (a file, not a folder) is linted too.
    assert (ROOT / "hpc_train" / "dist.py").resolve() in seen
