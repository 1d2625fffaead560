"""The timeout hierarchy on real Slurm: a lead too short for the checkpoint a run measured is warned about before
submission, and with ``cluster.slurm.signal_lead_s=auto`` the next job's lead covers it: its supervisor tells
the step to stop that long before the time limit, and the stop's checkpoint lands."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir
from hpc_train.train.checkpoint import Checkpoints

from .conftest import SLURM_2X1, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

# A checkpoint of about 600 MB (3 layers of 4096 and AdamW's two moments): 2-3 s to write, hash and fsync on the
# testbed (layers of 2048 gave 120 MB in 0.5 s: less than any whole-second lead).
JOB = [*SLURM_2X1, "model.hidden_sizes=[4096,4096,4096]", "trainer.batch_size=16", "trainer.plots=false"]


def test_a_lead_shorter_than_the_measured_checkpoint_is_warned_and_auto_covers_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = submit_job(run_dir, *JOB, "trainer.max_steps=20", "trainer.checkpoint_every_n_steps=10")
    assert wait_for_job(first, timeout=300) == "COMPLETED"
    rd = RunDir(run_dir)
    saved = [a.progress.checkpoint_s for a in rd.attempt_records() if a.progress is not None]
    assert saved and saved[-1] and saved[-1] > 1.0, rd.attempt_records()  # the ledger kept the slowest checkpoint
    measured_s = saved[-1]

    # auto, in a job of 2 minutes that would train far longer: its supervisor stops the step in time.
    second = submit_job(
        run_dir,
        *JOB,
        "trainer.max_steps=100000",
        "cluster.timeout_min=2",
        "cluster.slurm.signal_lead_s=auto",
        "cluster.slurm.srun_wait_s=10",
    )
    deadline = time.monotonic() + 300
    while not rd.requeue_records():
        assert time.monotonic() < deadline, "the job never stopped on the lead auto derived"
        time.sleep(1)
    subprocess.run(["scancel", second], check=False, timeout=30)  # it would come back from the requeue: enough
    wait_for_job(second, timeout=120)

    stop = rd.requeue_records()[0]
    assert stop.stop_saved_s is not None and stop.stopped_step, stop  # the stop's checkpoint was durable...
    assert any(r.step == stop.stopped_step for r in Checkpoints(rd).records()), stop  # ...and in the ledger
    job = rd.job()
    assert job is not None
    output = Path(job.slurm_output).read_text()
    lead = 2 * measured_s + 30  # at least: auto adds the step
    assert "signal_lead_s=auto: 2 x the stop measured" in output, output[-3000:]
    assert "signal_lead_s=auto: the step is told to stop at" in output, output[-3000:]
    said = [line for line in output.splitlines() if "stop signal" in line and "before it" in line]
    assert said and int(said[-1].split("USR2 ")[1].split(" s")[0]) >= lead - 1, said
    rank0 = (run_dir / "logs").glob("rank_0*.log")
    assert any("timeouts:" in p.read_text() for p in rank0)  # rank 0's log has the block too

    # A dry run of the same run dir with a 1 s lead: the hierarchy, and the warning with the measured numbers.
    # (Last: a dry run rewrites the run dir's config.yaml, and the 2-minute job would then find it finished.)
    args = ["cluster.slurm.srun_wait_s=1", "cluster.slurm.dry_run=true", f"hydra.run.dir={run_dir}"]
    short = cli("hpc_train", *JOB, "trainer.max_steps=100000", "cluster.slurm.signal_lead_s=1", *args, cwd=tmp_path)
    assert short.returncode == 0, short.stderr[-3000:]
    assert "timeouts:" in short.stdout and "KillWait          5 s" in short.stdout, short.stdout[-3000:]
    assert "WARNING: the stop signal comes 1 s before the time limit (cluster.slurm.signal_lead_s=1)" in short.stderr
    assert "HINT: cluster.slurm.signal_lead_s=auto" in short.stderr, short.stderr[-3000:]
