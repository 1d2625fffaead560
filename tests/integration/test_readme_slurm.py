"""The cluster=slurm examples of README.md and the manual (docs/), run on the testbed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpc_train.config import slurm_alias_overrides

from ..readme_examples import cli_examples, is_slurm, shrunk, shrunk_study
from .conftest import cli, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]


def as_run(args: list[str]) -> list[str]:
    """An example as the test runs it: shrunk, and waited for unless it is a sweep or a dry run."""
    given = slurm_alias_overrides(args)  # the README may spell a key either way
    waits = "-m" in args or "cluster.slurm.dry_run=true" in given or "cluster.slurm.wait=true" in given
    return shrunk(args) + ([] if waits else ["cluster.slurm.wait=true"])


SLURM_EXAMPLES: list[list[str]] = []
for _example in (args for args in cli_examples() if is_slurm(args)):
    if sorted(as_run(_example)) not in [sorted(as_run(e)) for e in SLURM_EXAMPLES]:
        SLURM_EXAMPLES.append(_example)  # `cluster.slurm.wait=true` or not, the test waits: run such a pair once


@pytest.mark.parametrize("args", SLURM_EXAMPLES, ids=" ".join)
def test_slurm_example_runs(args: list[str], tmp_path: Path) -> None:
    args = as_run(args)
    if "-m" in args:
        proc = cli("hpc_train", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        wait_for_job(re.search(r"job array (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
        collect = cli("hpc_train.jobs", "collect", str(tmp_path / "sweep"), cwd=tmp_path)
        rows = collect.stdout.splitlines()[1:]
        assert rows and all(" COMPLETED " in row for row in rows), collect.stdout
        return
    run_dir = tmp_path / "run"
    dry = "cluster.slurm.dry_run=true" in slurm_alias_overrides(args)
    proc = cli("hpc_train", *args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    if dry:
        assert "nothing submitted" in proc.stdout and (run_dir / "job.sbatch").is_file()
    else:
        assert (run_dir / "model_final.pt").is_file()


@pytest.mark.parametrize("args", [a for a in cli_examples("hpc_train.scaling") if is_slurm(a)], ids=" ".join)
def test_slurm_scaling_example_runs(args: list[str], tmp_path: Path) -> None:
    """Each point is a job of its shape (the 4-rank one across both nodes), and the figures add up."""
    proc = cli("hpc_train.scaling", *shrunk_study(args), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = tmp_path / "scaling"
    assert "recommended (strong scaling" in proc.stdout and (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    study = json.loads((out / "scaling.json").read_text())
    modes = ["strong", "weak"] if "both" in args else ["strong"]
    points = study["points"]
    assert [(p["mode"], p["world_size"], p["nodes"], p["tasks_per_node"]) for p in points] == [
        (mode, *shape) for mode in modes for shape in ((1, 1, 1), (2, 1, 2), (4, 2, 2))
    ]
    for mode in modes:
        first = next(p for p in points if p["mode"] == mode)
        assert first["speedup"] == 1.0 and first["efficiency"] == 1.0
        for p in (p for p in points if p["mode"] == mode):
            assert p["samples_per_s"] > 0
            assert p["speedup"] == pytest.approx(p["samples_per_s"] / first["samples_per_s"])
            assert p["efficiency"] == pytest.approx(p["speedup"] / p["world_size"])
        assert study["recommended"][mode] in (1, 2, 4) and f"recommended ({mode} scaling" in proc.stdout
    four = json.loads((out / f"{modes[-1]}-w4" / "rank_table.json").read_text())
    assert len({row["host"] for row in four}) == 2, "the 4-rank point did not span both nodes"
