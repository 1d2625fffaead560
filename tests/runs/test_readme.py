"""Every example in README.md runs: python blocks are executed, `python -m hpc_train` lines are launched
(the cluster=slurm ones in tests/integration/test_readme_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import REPO
from ..readme_examples import cli_examples, code_blocks, is_slurm, module_files, prepare_cwd, shrunk, shrunk_study

README = (REPO / "README.md").read_text()
LOCAL_EXAMPLES = [args for args in cli_examples() if not is_slurm(args)]


def test_readme_opens_with_the_two_commands() -> None:
    first = code_blocks(README)[0][1]
    assert "scripts/setup.sh && .venv/bin/python -m hpc_train" in first
    assert "scripts/test.sh" in first
    assert (REPO / ".ci" / "run").read_text().strip().endswith("scripts/test.sh")


@pytest.mark.slow
def test_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python block runs (the notebook one trains two small models, in a scratch folder)."""
    monkeypatch.chdir(tmp_path)
    prepare_cwd(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    python_blocks = [body for lang, body in code_blocks(README) if lang == "python"]
    assert len(python_blocks) >= 3 and "my_models.py" in module_files()
    for body in python_blocks:
        exec(compile(body, "README.md", "exec"), {})
    assert len(list((tmp_path / "outputs").glob("*/*/model_final.pt"))) == 2


def test_examples_found() -> None:
    assert len(LOCAL_EXAMPLES) >= 3
    assert len(cli_examples()) - len(LOCAL_EXAMPLES) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("args", LOCAL_EXAMPLES, ids=" ".join)
def test_local_examples_run(args: list[str], run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prepare_cwd(tmp_path)
    proc, run_dir = run_cli(*shrunk(args))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if any(a.startswith("script.") for a in args):  # the user's script trains; hpc_train only runs it
        assert "all 2 ranks completed" in proc.stdout
    else:
        assert (Path(run_dir) / "model_final.pt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("args", [a for a in cli_examples("hpc_train.scaling") if not is_slurm(a)], ids=" ".join)
def test_local_scaling_example_runs(args: list[str], tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "hpc_train.scaling", *shrunk_study(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recommended (" in proc.stdout and list(tmp_path.rglob("scaling.png"))
