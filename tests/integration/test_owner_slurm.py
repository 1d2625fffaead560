"""One owner per run dir on the real Slurm testbed: a job owns its run dir while Slurm says it has not ended
(pending, running, requeued); a resubmission after it ended is accepted."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir, read_json

from .conftest import SLURM_2X1, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

JOB = [
    *SLURM_2X1,  # who owns the run dir does not depend on the ranks a node
    "model.hidden_sizes=[64]",
    "cluster.submit=sbatch",
    "trainer.max_steps=100000",
    "trainer.max_epochs=0",
]


def squeue(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"], capture_output=True, text=True, timeout=20
    ).stdout.strip()


def wait_for_state(job_id: str, states: set[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while (state := squeue(job_id)) not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {state!r}, not one of {states} after {timeout}s"
        time.sleep(0.3)
    return state


def refused(run_dir: Path, job_id: str, *states: str) -> None:
    """A submission into ``run_dir`` is refused, naming the job that owns it in one of ``states``, and writes
    nothing there."""
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    proc = cli("hpc_train", *JOB, f"hydra.run.dir={run_dir}", cwd=run_dir.parent)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    named = [f"hydra.run.dir={run_dir} is in use by Slurm job {job_id} ({state} per squeue)" for state in states]
    assert any(n in proc.stderr for n in named), proc.stderr
    assert f"HINT: wait for it to end; stop it with `python -m hpc_train.jobs cancel {run_dir}`" in proc.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name in before} == before


def test_a_job_owns_its_run_dir_until_it_ends(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = submit_job(run_dir, *JOB, "+cluster.sbatch_args.hold=''")  # pending until released
    try:
        lease = json.loads((run_dir / "owner.json").read_text())
        assert (lease["kind"], lease["job_id"]) == ("slurm", first)
        assert squeue(first) == "PENDING"
        refused(run_dir, first, "PENDING")

        subprocess.run(["scontrol", "release", first], check=True, timeout=20)
        wait_for_state(first, {"RUNNING"})
        refused(run_dir, first, "RUNNING")

        # A requeue keeps the job id: the same owner.
        deadline = time.monotonic() + 120
        while not any(s.get("step") for s in RunDir(run_dir).read_statuses().values()):
            assert time.monotonic() < deadline, "the job never trained"
            time.sleep(0.5)
        subprocess.run(["scontrol", "requeue", first], check=True, timeout=20)
        wait_for_state(first, {"REQUEUED", "PENDING"}, timeout=60)
        refused(run_dir, first, "REQUEUED", "PENDING", "CONFIGURING", "RUNNING")  # it restarts within seconds
    finally:
        subprocess.run(["scancel", first], check=False, timeout=20)
    wait_for_job(first, timeout=120)

    second = submit_job(run_dir, *JOB)  # the job has ended: the run dir is free again
    try:
        assert second != first
        assert read_json(RunDir(run_dir).job_record)["job_id"] == second
        lease = json.loads((run_dir / "owner.json").read_text())
        assert (lease["kind"], lease["job_id"]) == ("slurm", second)
    finally:
        subprocess.run(["scancel", second], check=False, timeout=20)
    wait_for_job(second, timeout=120)
