"""The cluster=slurm examples of README.md and slurm/README.md, run on the testbed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpc_train.config import slurm_alias_overrides

from ..readme_examples import cli_examples, is_slurm, shrunk, shrunk_study
from .conftest import cli, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

SLURM_EXAMPLES = [args for args in cli_examples() if is_slurm(args)]


@pytest.mark.parametrize("args", SLURM_EXAMPLES, ids=" ".join)
def test_slurm_example_runs(args: list[str], tmp_path: Path) -> None:
    args = shrunk(args)
    if "-m" in args:
        proc = cli("hpc_train", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        wait_for_job(re.search(r"job array (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
        collect = cli("hpc_train.jobs", "collect", str(tmp_path / "sweep"), cwd=tmp_path)
        rows = collect.stdout.splitlines()[1:]
        assert rows and all(" COMPLETED " in row for row in rows), collect.stdout
        return
    run_dir = tmp_path / "run"
    given = slurm_alias_overrides(args)  # the README may spell a key either way
    dry = "cluster.slurm.dry_run=true" in given
    extra = [] if dry or "cluster.slurm.wait=true" in given else ["cluster.slurm.wait=true"]
    proc = cli("hpc_train", *args, *extra, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    if dry:
        assert "nothing submitted" in proc.stdout and (run_dir / "job.sbatch").is_file()
    else:
        assert (run_dir / "model_final.pt").is_file()


@pytest.mark.parametrize("args", [a for a in cli_examples("hpc_train.scaling") if is_slurm(a)], ids=" ".join)
def test_slurm_scaling_example_runs(args: list[str], tmp_path: Path) -> None:
    proc = cli("hpc_train.scaling", *shrunk_study(args), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "recommended (strong scaling" in proc.stdout and (tmp_path / "scaling" / "scaling.png").is_file()
