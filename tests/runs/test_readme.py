"""Every example in README.md runs: python blocks are executed, `python -m hpc_train` lines are launched."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ..conftest import REPO

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
CLI_EXAMPLES = [
    line.strip()
    for lang, body in BLOCKS
    if lang == "bash"
    for line in body.splitlines()
    if line.strip().startswith("python -m hpc_train ")
]
# Shrink each example so the suite stays fast; the overrides keep the example's own choices.
SHRINK = ["trainer.max_steps=3", "data.num_samples=512", "trainer.batch_size=16", "trainer.log_every_n_steps=1"]


def test_readme_opens_with_the_two_commands() -> None:
    first = BLOCKS[0][1]
    assert "scripts/setup.sh && .venv/bin/python -m hpc_train" in first
    assert "scripts/test.sh" in first
    assert (REPO / ".ci" / "run").read_text().strip().endswith("scripts/test.sh")


def test_python_examples_run() -> None:
    python_blocks = [body for lang, body in BLOCKS if lang == "python"]
    assert python_blocks
    for body in python_blocks:
        exec(compile(body, "README.md", "exec"), {})


@pytest.mark.slow
@pytest.mark.parametrize("example", CLI_EXAMPLES)
def test_cli_examples_run(example: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    args = [a for a in shlex.split(example)[3:] if not a.startswith("trainer.max_steps=")]
    proc, run_dir = run_cli(*args, *SHRINK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (Path(run_dir) / "model_final.pt").is_file()


def test_cli_examples_found() -> None:
    assert len(CLI_EXAMPLES) >= 3
