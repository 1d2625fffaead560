"""Preemption on the real testbed: signal at a random step, requeue, resume, and compare to an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir, read_json

from ..conftest import assert_bitwise_equal, wait_for_ranks
from .conftest import SLURM_2X1, Baseline, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

# 2 nodes x 1 rank, dropout on (each rank's generator matters), several epochs; slow enough (~5 s of steps) that
# a signal lands mid-run. One rank a node: what is tested here (every rank stops at the same step, across
# nodes, and resumes exactly) is the same with two, at half the CPU of the testbed's two real cores; two ranks
# a node are stopped (scancel) and resumed in test_elastic_slurm.py, and restarted in test_recovery_slurm.py.
JOB = [
    *SLURM_2X1,
    "model.hidden_sizes=[512,512]",
    "model.dropout=0.1",
    "trainer.max_steps=120",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=1",
    "trainer.plots=false",
    "trainer.tensorboard=false",
    "trainer.progress_bar=false",
]


def submit(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    return submit_job(run_dir, *JOB, *extra, env=env)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    return Baseline(submit(run_dir), run_dir)


def assert_requeued_and_exact(run_dir: Path, baseline: Baseline, job_id: str, requeued_by_us: bool) -> None:
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=run_dir.parent).stdout)[0]
    assert status["state"] == "COMPLETED", status
    assert {s["attempt"] for s in RunDir(run_dir).read_statuses().values()} == {1}  # SLURM_RESTART_COUNT=1
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert "resumed from" in log, log[-2000:]
    history = read_json(RunDir(run_dir).restarts)
    assert (history is not None) == requeued_by_us
    assert_bitwise_equal(baseline.ready(), run_dir)  # the resumed run ends exactly where the uninterrupted one does


@pytest.mark.generations
@pytest.mark.parametrize(
    ("submit_mode", "full"), [("submitit", False), ("sbatch", True)], ids=["submitit-steps", "sbatch-full"]
)
def test_usr2_at_a_random_step_requeues_and_resumes_exactly(
    tmp_path: Path, baseline: Baseline, submit_mode: str, full: bool
) -> None:
    """`scancel --signal=USR2 [--full]`: every rank checkpoints the same step, rank 0 requeues, the rerun is exact."""
    step = random.Random().randint(5, 80)
    print(f"signalling at step {step}")
    run_dir = tmp_path / "run"
    job_id = submit(run_dir, f"cluster.submit={submit_mode}")
    wait_for_ranks(run_dir, step)
    signalled = time.monotonic()
    subprocess.run(["scancel", "--signal=USR2", *(["--full"] if full else []), job_id], check=True, timeout=30)
    assert_requeued_and_exact(run_dir, baseline, job_id, requeued_by_us=True)
    history = read_json(RunDir(run_dir).restarts)
    assert len(history) == 1 and history[0]["signal"] == signal.SIGUSR2 and history[0]["stopped_step"] >= step
    durable = history[0]["stop_saved_s"]  # rank 0's count, from the signal to its checkpoint on disk
    assert 0 < durable < 30, history
    status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert f"requeued 1x; checkpoint durable {durable:.1f} s after each stop signal" in status, status
    print(
        f"stopped at step {history[0]['stopped_step']}, checkpoint durable {durable:.2f}s after USR2; completed "
        f"{time.monotonic() - signalled:.1f}s after it"
    )


def test_scontrol_requeue_checkpoints_on_sigterm(tmp_path: Path, baseline: Baseline) -> None:
    """Slurm's own requeue sends SIGTERM (then SIGKILL after KillWait): the ranks checkpoint in between."""
    run_dir = tmp_path / "run"
    job_id = submit(run_dir)
    wait_for_ranks(run_dir, random.Random().randint(5, 80))
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
    assert_requeued_and_exact(run_dir, baseline, job_id, requeued_by_us=False)
    assert "signal 15" in (run_dir / "logs" / "rank_0.log").read_text()


@pytest.mark.generations
def test_one_array_element_is_requeued_alone(tmp_path: Path) -> None:
    """USR2 to element 1 of a 2-element sweep: only it restarts (`scontrol requeue A_1`); both complete. On one
    node each, 120 steps take about a second (8,000 samples/s), less than a loaded machine takes to see step 20
    and send the signal (CI: the element completed first): 1,000 steps here."""
    proc = cli(
        "hpc_train",
        "-m",
        *[a for a in JOB if not a.startswith(("cluster.nodes", "trainer.max_steps"))],
        "cluster.nodes=1",
        "trainer.max_steps=1000",
        "trainer.lr=1e-3,2e-3",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    element = RunDir(tmp_path / "sweep" / "1")
    array_id = str(read_json(element.job_record)["array_job_id"])
    wait_for_ranks(element.path, 20)
    subprocess.run(["scancel", "--signal=USR2", f"{array_id}_1"], check=True, timeout=30)
    assert wait_for_job(array_id, timeout=300) == "COMPLETED"
    history = read_json(element.restarts)
    assert history and len(history) == 1
    assert read_json(element.status_path(0))["attempt"] == 1
    assert (element.path / "model_final.pt").is_file() and (tmp_path / "sweep" / "0" / "model_final.pt").is_file()
    assert read_json(RunDir(tmp_path / "sweep" / "0").status_path(0))["attempt"] == 0
    assert read_json(element.status_path(0))["step"] == 1000


@pytest.mark.generations
def test_watchdog_ends_a_hung_slurm_job(tmp_path: Path) -> None:
    """A rank that sleeps in a step (which --kill-on-bad-exit never sees): the live rank dumps its stacks into
    its log and, with restarts in the allocation turned off, the job ends FAILED within the watchdog time.
    (A frozen rank retried in the allocation: tests/integration/test_recovery_slurm.py.)"""
    run_dir = tmp_path / "run"
    job_id = submit(
        run_dir,
        "cluster.submit=sbatch",
        "cluster.max_failures=0",
        "trainer.max_steps=100000",
        "trainer.watchdog_s=10",
        env={"HPC_TRAIN_FAULT": "rank=1,step=5,kind=hang"},
    )
    wait_for_ranks(run_dir, 1)
    start = time.monotonic()
    final = wait_for_job(job_id, timeout=120)
    ended_after = time.monotonic() - start
    assert final in ("FAILED", "CANCELLED"), final
    assert ended_after < 10 + 60, f"took {ended_after:.0f}s"
    log = (run_dir / "logs" / "rank_0.log").read_text()  # the live rank, on node1
    assert "watchdog: no progress" in log and "most recent call first" in log, log[-1500:]
    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path).stdout)[0]
    assert status["done"] and not status["ok"] and "watchdog" in status["detail"], status
    print(f"hang: job ended {ended_after:.1f}s after the first step (watchdog 10 s)")


def _squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_a_run_dir_purged_while_its_job_waits_in_the_queue_comes_back_from_the_mirror(
    tmp_path: Path, baseline: Baseline
) -> None:
    """USR2 at a random step with trainer.mirror set: the ranks checkpoint, the copy lands, the job is requeued and
    waits in the queue (its partition is down). Meanwhile a scratch purge deletes every file of the run dir (its
    folders stay: Slurm cannot even open a job's output in a folder that is gone, measured FAILED 0:53). The job
    starts again: the supervisor brings the run's story back from the mirror (the job script names it), rank 0
    the newest checkpoint, and the run ends bit for bit where the uninterrupted one does."""
    baseline.ready()  # nothing else in the partition while it is down
    step = random.Random().randint(10, 80)
    run_dir, mirror = tmp_path / "run", tmp_path / "project" / "mirror"
    job_id = submit(run_dir, "cluster.submit=sbatch", f"trainer.mirror={mirror}")
    wait_for_ranks(run_dir, step)
    subprocess.run(["scontrol", "update", "partitionname=debug", "state=down"], check=True, timeout=30)
    try:
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
        deadline = time.monotonic() + 120
        while _squeue_state(job_id) != "PENDING":
            assert time.monotonic() < deadline, f"job {job_id} was not requeued: {_squeue_state(job_id)}"
            time.sleep(0.5)
        held = json.loads((mirror / "mirror.json").read_text())
        stopped = max(f["step"] for f in held["files"] if f.get("step") is not None)
        assert stopped >= step, held
        purged = [p for p in run_dir.rglob("*") if p.is_file()]
        for path in purged:
            path.unlink()
        assert not (run_dir / "config.yaml").exists() and len(purged) > 10
    finally:
        subprocess.run(["scontrol", "update", "partitionname=debug", "state=up"], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    output = "\n".join(p.read_text() for p in (run_dir / "logs").glob("slurm-*.out"))
    assert "brought back verified from the mirror" in output and "config.yaml" in output, output[-3000:]
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert f"resuming from the mirror {mirror}" in log and f"(step {stopped})" in log, log[-3000:]
    assert_bitwise_equal(baseline.ready(), run_dir)
    status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert "COMPLETED" in status, status
    print(f"signalled at step {step}; stopped at {stopped}; purged {len(purged)} files; resumed from the mirror")
