"""Recovery without a human, on the real testbed: a failed training step starts again in the same allocation.

- 2 nodes + 1 spare (partition all), checkpoints every 10 steps, SIGKILL of a rank on node2 at about step 40:
  the same job completes (Slurm's Restarts still 0), the second attempt on node1 and node3, weights
  bit-identical to an uninterrupted run, and the goodput ledger agrees with the gap the test measured.
- node2 marked DOWN under a job with a spare (sbatch mode): the allocation survives (--no-kill), the next
  attempt runs on node1 and node3.
- Without a spare (sbatch mode, a user's script): the same kill, and the job completes on node1 and node2.
- A frozen rank (SIGSTOP): caught by the watchdog, retried in the allocation.
- The same exception from the same step on every attempt: fatal after the second, exit 86, no requeue.
- A run that diverges (NaN loss): fatal at once, exit 86, no retry and no requeue; its checkpoints are finite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hpc_train.core.rundir import RunDir, read_json

from ..conftest import REPO, assert_bitwise_equal, wait_for_step
from .conftest import cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

JOB = [
    "cluster=slurm",
    "cluster.status_every_s=1",  # the tests act on steps they read from the ranks' statuses
    "cluster.nodes=2",
    "cluster.tasks_per_node=2",
    "data.num_samples=4096",
    "model.hidden_sizes=[512,512]",
    "model.dropout=0.1",
    "trainer.max_steps=120",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=10",
    "trainer.plots=false",
    "trainer.tensorboard=false",
    "trainer.progress_bar=false",
]
LOOP = REPO / "hpc_train" / "examples" / "preemptible_loop.py"


def slurm_job(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (the job stays listed for MinJobAge after it ends)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def kill_on(run_dir: Path, host: str, step: int, timeout: float = 180, ranks: int = 4) -> tuple[float, int]:
    """SIGKILL the training process of a rank on ``host`` once all ``ranks`` passed ``step``; (time, rank)."""
    rd = RunDir(run_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = rd.read_statuses()
        if len(statuses) == ranks and min(int(s.get("step", 0)) for s in statuses.values()) >= step:
            rank, status = next((r, s) for r, s in sorted(statuses.items()) if s["host"] == host)
            os.kill(int(status["pid"]), signal.SIGKILL)  # the testbed's nodes share this machine's pid namespace
            return time.time(), rank
        time.sleep(0.05)
    raise AssertionError(f"no step {step} within {timeout}s")


def wait_node_idle(node: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True, timeout=30)
        if state.stdout.split() and set(state.stdout.split()) == {"idle"}:
            return True
        time.sleep(0.5)
    return False


def status_of(run_dir: Path) -> dict[str, object]:
    out = cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=run_dir.parent).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


@pytest.mark.generations
def test_killed_rank_restarts_on_the_spare_node_exactly(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline" / "run"
    baseline.parent.mkdir()
    base_id = submit_job(baseline, *JOB, "cluster.partition=all")  # queued behind the spare job, or beside it
    run_dir = tmp_path / "spare" / "run"
    run_dir.parent.mkdir()
    job_id = submit_job(run_dir, *JOB, "cluster.partition=all", "cluster.spare_nodes=1")
    killed_at, rank = kill_on(run_dir, "node2", 40)
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    assert slurm_job(job_id)["Restarts"] == "0"  # no requeue: the same job, never back in the queue
    attempts = RunDir(run_dir).read_attempts()
    assert [a["outcome"] for a in attempts] == ["failed", "completed"], attempts
    assert attempts[0]["nodes"] == ["node1", "node2"] and attempts[1]["nodes"] == ["node1", "node3"]
    failure = attempts[0]["failure"]
    assert (failure["kind"], failure["rank"], failure["host"]) == ("killed", rank, "node2"), failure
    assert [e["host"] for e in RunDir(run_dir).read_bad_nodes()] == ["node2"]
    table = read_json(RunDir(run_dir).rank_table)
    assert {row["host"] for row in table} == {"node1", "node3"} and {row["attempt"] for row in table} == {1}
    assert (run_dir / "logs" / "rank_0.restart1.log").is_file()

    goodput = read_json(RunDir(run_dir).goodput)
    first_step = attempts[1]["progress"]["first_time"]
    print(f"restart latency (kill -> first step of attempt 1): {first_step - killed_at:.1f}s; ledger: {goodput}")
    assert 0 < goodput["ettr"] <= 1 and goodput["failures"] == 1
    # The ledger's failure time is rank 0's last reported step, at most a second or two before the kill.
    [restart] = goodput["restarts"]
    assert restart["in_allocation"] and abs(restart["latency_s"] - (first_step - killed_at)) < 3, restart
    # Time lost = the first attempt's startup + the restart gap this test measured (from the kill, a step or
    # so after the checkpoint of step 40, to the next first step) + the final save: within a few seconds.
    unexplained = goodput["lost_s"] - goodput["per_attempt"][0]["startup_s"] - (first_step - killed_at)
    assert -1 < unexplained < 4, (unexplained, goodput)
    shown = status_of(run_dir)
    assert shown["state"] == "COMPLETED" and shown["attempt"] == 1 and shown["goodput"]["ettr"] == goodput["ettr"]

    assert wait_for_job(base_id, timeout=300) == "COMPLETED"
    assert_bitwise_equal(baseline, run_dir)


@pytest.mark.generations
def test_without_a_spare_the_job_goes_on_with_the_nodes_that_are_left(tmp_path: Path) -> None:
    """3 nodes, cluster.min_nodes=2, no spare: a rank on node3 SIGKILLed at step 40, and the same job (Slurm's
    Restarts still 0) completes on node1 and node2 from the newest checkpoint, with the same global batch."""
    run_dir = tmp_path / "run"
    three = [a for a in JOB if not a.startswith("cluster.")] + [
        "cluster=slurm",
        "cluster.nodes=3",
        "cluster.tasks_per_node=1",
        "cluster.status_every_s=1",  # kill_on acts on the step the statuses say
    ]
    job_id = submit_job(run_dir, *three, "trainer.batch_size=32", "cluster.partition=all", "cluster.min_nodes=2")
    assert "#SBATCH --no-kill" in (run_dir / "job.sbatch").read_text()
    killed_at, _ = kill_on(run_dir, "node3", 40, ranks=3)
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    assert slurm_job(job_id)["Restarts"] == "0"
    rd = RunDir(run_dir)
    attempts = rd.read_attempts()
    assert [a["outcome"] for a in attempts] == ["failed", "completed"], attempts
    assert [(a["nodes"], a["ranks"]) for a in attempts] == [(["node1", "node2", "node3"], 3), (["node1", "node2"], 2)]
    assert (attempts[0]["failure"]["kind"], attempts[0]["failure"]["host"]) == ("killed", "node3")
    [shrink] = [r.to_json() for r in rd.reshape_records()]
    assert shrink["was"].startswith("3 nodes x 1 task (global batch 96 = 32 a rank x 3 ranks")
    assert shrink["onto"] == "2 nodes x 1 task (global batch 96 = 24 a rank x 2 ranks x 2 accumulated)"
    assert "without node3, no spare left (cluster.min_nodes=2)" in shrink["why"]
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert "onto 2 nodes x 1 task (global batch 96" in log, log[-2000:]
    final = torch.load(sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1], weights_only=False)
    assert final["step"] == 120 and final["shape"]["world_size"] == 2 and final["shape"]["global_batch"] == 96
    shown = status_of(run_dir)
    assert shown["state"] == "COMPLETED", shown
    text = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert "went on with 2 nodes x 1 task" in text, text
    [restart] = read_json(rd.goodput)["restarts"]
    assert (restart["in_allocation"], restart["ranks_before"], restart["ranks_after"]) == (True, 3, 2), restart
    first_step = attempts[1]["progress"]["first_time"]
    print(f"shrink recovery (kill -> first step on 2 nodes): {first_step - killed_at:.1f}s; ledger {restart}")


def test_lost_node_is_replaced_by_the_spare(tmp_path: Path) -> None:
    """node2 goes DOWN under a running job with a spare (`scontrol update state=down`: what slurmctld does to a
    node that stops answering). With --no-kill the allocation survives; the next attempt runs on node1 and
    node3, and the job completes without a requeue."""
    run_dir = tmp_path / "run"
    # One rank a node: a node lost is the same with two, at half the CPU of the testbed's two real cores.
    one = [*JOB, "cluster.tasks_per_node=1"]
    job_id = submit_job(run_dir, *one, "cluster.partition=all", "cluster.spare_nodes=1", "cluster.submit=sbatch")
    assert "#SBATCH --no-kill" in (run_dir / "job.sbatch").read_text()
    rd = RunDir(run_dir)
    deadline = time.monotonic() + 180
    while not (len(s := rd.read_statuses()) == 2 and min(int(x.get("step", 0)) for x in s.values()) >= 40):
        assert time.monotonic() < deadline, "no step 40 within 180s"
        time.sleep(0.05)
    down = ["scontrol", "update", "nodename=node2", "state=down", "reason=hpc_train test: node lost"]
    try:
        subprocess.run(down, check=True, timeout=30)
        assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    finally:
        # Back in service (the testbed's ReturnToService=2 often has done it already: then this is refused).
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True, timeout=30)
        assert wait_node_idle("node2"), "node2 did not come back"
    assert slurm_job(job_id)["Restarts"] == "0"
    attempts = rd.read_attempts()
    assert [a["outcome"] for a in attempts] == ["failed", "completed"], attempts
    assert [a["nodes"] for a in attempts] == [["node1", "node2"], ["node1", "node3"]]
    failure = attempts[0]["failure"]
    assert failure["host"] == "node2" and failure["suspects"] == ["node2"], failure
    assert [e["host"] for e in rd.read_bad_nodes()] == ["node2"]
    assert (run_dir / "model_final.pt").is_file()


@pytest.mark.generations
def test_killed_script_rank_without_spare_reuses_the_node(tmp_path: Path) -> None:
    """sbatch mode and a user's script that saves every 10 steps: its process on node2 is SIGKILLed, the next
    attempt runs on node1 and node2 again and resumes from the script's own checkpoint. (One rank a node: the
    recovery is the same as with two, at half the CPU of the testbed's two real cores.)"""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    args = ",".join(["--out", str(out), "--steps", "150", "--sleep", "0.03", "--no-integration"])
    job_id = submit_job(
        run_dir,
        "cluster=slurm",
        "cluster.nodes=2",
        "cluster.tasks_per_node=1",
        "cluster.submit=sbatch",
        f"script.path={LOOP}",
        f"script.args=[{args}]",
    )
    wait_for_step(out, 1, 35)  # past its saves at steps 10, 20 and 30
    assert (out / "checkpoint.pt").exists()
    worker = next(s for s in RunDir(run_dir).read_statuses().values() if s["host"] == "node2")
    script_pid = subprocess.run(["pgrep", "-P", str(worker["pid"])], capture_output=True, text=True).stdout.split()[0]
    os.kill(int(script_pid), signal.SIGKILL)
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    assert slurm_job(job_id)["Restarts"] == "0"
    attempts = RunDir(run_dir).read_attempts()
    assert [a["outcome"] for a in attempts] == ["failed", "completed"], attempts
    assert [a["nodes"] for a in attempts] == [["node1", "node2"], ["node1", "node2"]]
    assert attempts[0]["failure"]["kind"] == "killed" and attempts[0]["failure"]["host"] == "node2"
    starts = [int(line) for line in (out / "starts.txt").read_text().split()]
    assert starts[0] == 0 and starts[1] >= 10 and len(starts) == 2, starts
    assert (out / "final.pt").is_file()


@pytest.fixture(scope="module")
def fault_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """Three small jobs at once on the debug partition: a rank frozen in attempt 0 only, an exception raised by
    rank 1 at step 8 of every attempt, and a learning rate that makes the loss NaN within a few steps."""
    small = [*JOB, "cluster.tasks_per_node=1", "trainer.max_steps=40", "cluster.submit=sbatch"]
    jobs = {}
    for name, fault, extra in (
        ("freeze", "rank=1,step=15,kind=freeze,attempt=0", ["trainer.watchdog_s=8"]),
        ("raise", "rank=1,step=8,kind=raise", []),
        ("diverge", "", ["optim=sgd", "trainer.lr=3000", "trainer.checkpoint_every_n_steps=2"]),
    ):
        run_dir = tmp_path_factory.mktemp(name) / "run"
        jobs[name] = (submit_job(run_dir, *small, *extra, env={"HPC_TRAIN_FAULT": fault}), run_dir)
    return jobs


def test_frozen_rank_is_caught_by_the_watchdog_and_retried(fault_jobs: dict[str, tuple[str, Path]]) -> None:
    job_id, run_dir = fault_jobs["freeze"]
    assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    attempts = RunDir(run_dir).read_attempts()
    assert [a["outcome"] for a in attempts] == ["failed", "completed"], attempts
    failure = attempts[0]["failure"]
    assert failure["kind"] == "hang" and "watchdog" in failure["error"] and failure["suspects"] == ["node2"]
    assert attempts[1]["progress"]["first_step"] == 11  # resumed from the checkpoint of step 10
    assert slurm_job(job_id)["Restarts"] == "0"


def fatal_attempts(job_id: str, run_dir: Path) -> list[dict[str, Any]]:
    """The attempts of a job that must have ended on a fatal failure: FAILED with exit 86, never requeued."""
    assert wait_for_job(job_id, timeout=300) == "FAILED"
    job = slurm_job(job_id)
    assert job["ExitCode"] == "86:0" and job["Restarts"] == "0", job
    return RunDir(run_dir).read_attempts()


def test_the_same_exception_twice_is_fatal(fault_jobs: dict[str, tuple[str, Path]]) -> None:
    job_id, run_dir = fault_jobs["raise"]
    attempts = fatal_attempts(job_id, run_dir)
    assert [a["outcome"] for a in attempts] == ["failed", "fatal"], attempts  # no third attempt
    assert attempts[0]["failure"]["kind"] == "exception"
    failure = attempts[1]["failure"]
    assert (failure["kind"], failure["rank"], failure["host"], failure["step"]) == ("repeated_exception", 1, "node2", 8)
    assert "injected fault" in failure["error"] and "Traceback" in failure["traceback"]
    shown = status_of(run_dir)
    assert shown["state"] == "FAILED" and "repeated_exception" in str(shown["detail"]), shown
    text = cli("hpc_train.jobs", "status", str(run_dir), cwd=run_dir.parent).stdout
    assert "repeated_exception (fatal): rank 1 on node2 at step 8" in text and "RuntimeError" in text, text


def test_divergence_is_fatal_at_once_and_keeps_the_finite_checkpoints(fault_jobs: dict[str, tuple[str, Path]]) -> None:
    job_id, run_dir = fault_jobs["diverge"]
    attempts = fatal_attempts(job_id, run_dir)
    assert [a["outcome"] for a in attempts] == ["fatal"], attempts  # not retried: it would diverge again
    assert attempts[0]["failure"]["kind"] == "diverged" and "HINT: lower trainer.lr" in attempts[0]["failure"]["error"]
    checkpoints = RunDir(run_dir).checkpoint_files()
    assert checkpoints, "the steps before the divergence left no checkpoint"
    for path in checkpoints:
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(t).all() for t in state["model"].values()), path
    assert not (run_dir / "model_final.pt").exists()
    text = cli("hpc_train.jobs", "status", str(run_dir), cwd=run_dir.parent).stdout
    assert "diverged (fatal)" in text, text
