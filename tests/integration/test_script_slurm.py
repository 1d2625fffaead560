"""A user's own torchrun loop on the Slurm testbed: preempted with `scancel --signal=USR2`, requeued by
hpc_train, resumed from the script's own save, and ending with the uninterrupted run's weights."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from hpc_train.core.rundir import RunDir, read_json

from ..conftest import REPO, wait_for_step
from .conftest import SLURM_2X1, Baseline, cli, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

LOOP = REPO / "hpc_train" / "examples" / "preemptible_loop.py"


def submit_loop(root: Path, *extra: str) -> tuple[str, Path, Path]:
    """Submit the loop as a 2 x 1 job; returns (job id, run dir, the loop's output folder)."""
    run_dir, out = root / "run", root / "out"
    out.mkdir(parents=True)
    args = ",".join(["--out", str(out), "--steps", "200", "--sleep", "0.02", *extra])
    proc = cli(
        "hpc_train", *SLURM_2X1, f"script.path={LOOP}", f"script.args=[{args}]", f"hydra.run.dir={run_dir}", cwd=root
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(read_json(RunDir(run_dir).job_record)["job_id"]), run_dir, out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    job_id, _, out = submit_loop(tmp_path_factory.mktemp("baseline"))
    return Baseline(job_id, out / "final.pt")


@pytest.mark.parametrize("integration", [True, False], ids=["should_stop", "no-integration"])
def test_preempted_script_is_requeued_and_resumes_from_its_own_save(
    tmp_path: Path, baseline: Baseline, integration: bool
) -> None:
    job_id, run_dir, out = submit_loop(tmp_path, *([] if integration else ["--no-integration"]))
    reached = wait_for_step(out, 1, 70)  # of its 200 steps
    signalled = time.monotonic()
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    took = time.monotonic() - signalled
    starts = [int(s) for s in (out / "starts.txt").read_text().split()]
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] < 200, starts  # requeued once, resumed its save
    history = RunDir(run_dir).read_restarts()
    assert len(history) == 1 and history[0]["signal"] == signal.SIGUSR2, history
    if integration:  # the loop reported its steps: the attempt's progress is known and matches its save
        assert history[0]["stopped_step"] == starts[1], history
    assert (run_dir / "logs" / "rank_0.restart1.log").exists()
    final, expected = (torch.load(p, weights_only=True) for p in (out / "final.pt", baseline.ready()))
    assert all(torch.equal(final[k], expected[k]) for k in expected), "the resumed run's weights differ"
    print(f"USR2 at step {reached}; resumed from step {starts[1]}; completed {took:.1f}s after the signal")
