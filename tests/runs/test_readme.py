"""Every example in README.md and the manual (docs/) runs: python blocks are executed, `python -m hpc_train` lines
are launched (the cluster=slurm ones in tests/integration/test_readme_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import REPO
from ..readme_examples import (
    cli_examples,
    code_blocks,
    is_slurm,
    manual_blocks,
    module_files,
    prepare_cwd,
    shrunk,
    shrunk_study,
    user_conf_files,
    user_repo_examples,
)

README = (REPO / "README.md").read_text()
SCVI_EXAMPLE = "script.module=hpc_train.examples.scvi_script"
LIGHTNING_EXAMPLE = "script.module=hpc_train.examples.lightning_script"
BASELINES = (SCVI_EXAMPLE, LIGHTNING_EXAMPLE)
"""Run whole, as the uninterrupted baselines of tests/runs/test_framework_preemption.py's tests."""
LOCAL_EXAMPLES = [args for args in cli_examples() if not is_slurm(args) and not set(BASELINES) & set(args)]


def test_readme_opens_with_the_two_commands() -> None:
    first = code_blocks(README)[0][1]
    assert "scripts/setup.sh && .venv/bin/python -m hpc_train" in first
    assert "scripts/test.sh" in first
    assert (REPO / ".ci" / "run").read_text().strip().endswith("scripts/test.sh")


@pytest.mark.slow
def test_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python block of the manual runs (the notebook one trains two small models, in a scratch folder)."""
    monkeypatch.chdir(tmp_path)
    prepare_cwd(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    python_blocks = [body for lang, body in manual_blocks() if lang == "python"]
    assert len(python_blocks) >= 3 and "my_models.py" in module_files()
    for body in python_blocks:
        exec(compile(body, "the manual", "exec"), {})
    assert len(list((tmp_path / "outputs").glob("*/*/model_final.pt"))) == 2


def test_examples_found() -> None:
    assert len(LOCAL_EXAMPLES) >= 3
    assert len(cli_examples()) - len(LOCAL_EXAMPLES) >= 5


# The Configuration page's examples, run as the manual writes them: each must learn within its budget.
TEACHING = [args for args in LOCAL_EXAMPLES if args[0] in ("trainer.max_steps=200", "model=cnn", "cluster=debug")]


@pytest.mark.slow
@pytest.mark.parametrize("args", [a for a in LOCAL_EXAMPLES if a not in TEACHING], ids=" ".join)
def test_local_examples_run(args: list[str], run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Shrunk to a few steps; the teaching examples run whole in test_configuration_examples_learn."""
    prepare_cwd(tmp_path)
    proc, run_dir = run_cli(*shrunk(args))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if any(a.startswith("script.") for a in args):  # the user's script trains; hpc_train only runs it
        assert "completed" in proc.stdout.strip().splitlines()[-1], proc.stdout[-2000:]
    else:
        assert (Path(run_dir) / "model_final.pt").is_file()


def test_the_teaching_examples_are_found() -> None:
    assert len(TEACHING) == 3


@pytest.mark.slow
@pytest.mark.parametrize("args", TEACHING, ids=" ".join)
def test_configuration_examples_learn(args: list[str], run_cli) -> None:  # type: ignore[no-untyped-def]
    """Unshrunk: the final validation accuracy is well above chance (0.1), as the manual says."""
    from hpc_train.core.metrics import read_metrics

    proc, run_dir = run_cli(*args, "trainer.progress_bar=false", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    accuracy = [r["val_acc"] for r in read_metrics(run_dir / "metrics.jsonl") if "val_acc" in r]
    assert accuracy and accuracy[-1] > 0.3, accuracy


@pytest.mark.slow
@pytest.mark.parametrize("args", [a for a in cli_examples("hpc_train.scaling") if not is_slurm(a)], ids=" ".join)
def test_local_scaling_example_runs(args: list[str], tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "hpc_train.scaling", *shrunk_study(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recommended (" in proc.stdout and list(tmp_path.rglob("scaling.png"))


def test_user_repository_example_is_complete() -> None:
    assert set(user_conf_files()) == {
        "conf/cluster/mycluster.yaml",
        "conf/model/tiny.yaml",
        "conf/experiment/quick.yaml",
    }
    examples = user_repo_examples()
    assert len(examples) == 4 and any("cluster=mycluster" in e for e in examples)


@pytest.mark.slow
@pytest.mark.parametrize("args", [a for a in user_repo_examples() if "cluster=mycluster" not in a], ids=" ".join)
def test_user_repository_runs_here(args: list[str], tmp_path: Path) -> None:
    """The manual's user repository (its own conf/ and model module, outside this repo) trains locally through
    the installed console script; its model, data and experiment come from its own folder."""
    import subprocess
    import sys

    repo = tmp_path / "myproject"
    repo.mkdir()
    prepare_cwd(repo)
    hpc_train = Path(sys.executable).parent / "hpc-train"
    sweep = "-m" in args
    proc = subprocess.run(
        [str(hpc_train), *args, "hydra.sweep.dir=run" if sweep else "hydra.run.dir=run", "trainer.progress_bar=false"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    from hpc_train.config import load_config

    width = next((a.split("=", 1)[1] for a in args if a.startswith("model.width=")), "64")
    runs = [repo / "run" / str(i) for i in range(len(width.split(",")))] if sweep else [repo / "run"]
    for run, value in zip(runs, width.split(","), strict=True):
        cfg = load_config(run / "config.yaml")
        assert cfg.model == {"_target_": "my_models.TinyNet", "width": int(value)} and cfg.trainer.max_steps == 40
        assert (run / "model_final.pt").is_file()
