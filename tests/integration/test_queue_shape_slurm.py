"""Whatever nodes the queue gives (#43), on the real testbed (partition all: node1, node2 and node3).

Another job holds node3. A run with cluster.nodes=3 cluster.min_nodes=2 asks Slurm for 2-3 nodes and starts at
once on node1 and node2. Preempted (USR2), it comes back on what is free: 2 nodes again. Once node3 is free, the
run's own growth check (every 6 s here) sees that a third node would start at once, finds the work left worth
the move, checkpoints and requeues itself, and comes back on 3. It trains every step once, on the samples an
uninterrupted 3-node job trains them on, and ends within the elastic tolerance of that job.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir

from ..conftest import wait_for_ranks
from .conftest import Baseline, cli, submit_job, wait_for_job
from .test_elastic_slurm import RANK_BATCH, STEPS_PER_EPOCH, USER_DATA, job, trained_samples

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

STEPS = 20 * STEPS_PER_EPOCH
"""Enough steps left after the return on 2 nodes that a third is worth a requeue: on 2 nodes a step reads two
batches (2 x 50 ms), on 3 one."""
RANGE = ["cluster.partition=all", "cluster.min_nodes=2", "cluster.slurm.grow_every_min=0.1"]
"""On 2 nodes the global batch of 3 x 16 is 2 ranks x 12 x 2 accumulated."""


def squeue(job_id: str) -> tuple[str, int]:
    """The job's state and node count (squeue's)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T %D"], capture_output=True, text=True, timeout=20
    ).stdout.split()
    return (out[0], int(out[1])) if len(out) == 2 else ("", 0)


def hold(node: str) -> str:
    """Another user's exclusive job on ``node`` (10 minutes at most), once it runs; its job id."""
    argv = ["sbatch", "--parsable", "--exclusive", "-p", "all", "-w", node, "-t", "10", "-o", "/dev/null"]
    holder = subprocess.run([*argv, "--wrap", "sleep 600"], capture_output=True, text=True, timeout=30, check=True)
    job_id = holder.stdout.strip()
    deadline = time.monotonic() + 60
    while squeue(job_id)[0] != "RUNNING":
        assert time.monotonic() < deadline, f"the job that holds {node} did not start"
        time.sleep(0.2)
    return job_id


def restarts(job_id: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20).stdout
    return int(next(f for f in out.split() if f.startswith("Restarts=")).split("=", 1)[1])


def back_again(run_dir: Path, job_id: str, restart: int, timeout: float = 120) -> int:
    """Wait for the requeued job to run again (Slurm's restart ``restart``); the step the stopped attempt saved."""
    deadline = time.monotonic() + timeout
    while restarts(job_id) < restart or squeue(job_id)[0] != "RUNNING":
        if time.monotonic() > deadline:
            said = [
                line for log in sorted((run_dir / "submitit").glob("*.out")) for line in log.read_text().splitlines()
            ]
            checks = "\n".join(line for line in said if "growth check" in line or "requeue" in line)
            raise AssertionError(f"job {job_id} did not run again within {timeout:.0f} s: {squeue(job_id)}\n{checks}")
        time.sleep(0.2)
    history = RunDir(run_dir).requeue_records()
    assert len(history) == restart, history
    stopped = history[-1].stopped_step
    assert stopped is not None
    return stopped


@pytest.mark.generations
def test_a_range_starts_on_what_is_free_and_comes_back_on_what_is_free(tmp_path: Path) -> None:
    (tmp_path / "elastic_data.py").write_text(USER_DATA)
    base_log, log = tmp_path / "ids-baseline", tmp_path / "ids"
    base_log.mkdir()
    log.mkdir()
    # 1G a node: without it a job takes all of a node's memory (the testbed's DefMemPerNode is unlimited), and the
    # baseline could not run beside the run.
    three = [*job(log, 3, tasks_per_node=1, delay_s=0.05, steps=STEPS), "cluster.partition=all", "cluster.slurm.mem=1G"]
    holder_id = hold("node3")
    try:
        # Before submitting: Slurm's start for each count (node3 is held for 10 minutes), and no step time yet.
        dry = cli(
            "hpc_train", *three, *RANGE, "cluster.slurm.dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}", cwd=tmp_path
        )
        assert dry.returncode == 0, dry.stderr[-2000:]
        lines = dry.stdout.splitlines()  # (after the timeout hierarchy)
        table = lines[next((i for i, line in enumerate(lines) if line.startswith("hpc_train: asking for")), 0) :]
        assert table[0].startswith("hpc_train: asking for 2-3 nodes: when each node count would start") and (
            f"({STEPS} steps left; start-up not measured yet)" in table[0]
        ), dry.stdout
        assert re.fullmatch(r"2 +\S+ \S+ \(now\) +\? +\?", table[2]), table[2]
        assert re.fullmatch(r"3 +\S+ \S+ \(in (9|10) min\) +\? +\?", table[3]), table[3]
        assert "no finish time estimated: no step time is measured" in table[4]
        run_dir = tmp_path / "run"
        job_id = submit_job(run_dir, *three, *RANGE)
        assert "#SBATCH --nodes=2-3" in (run_dir / "submitit" / f"{job_id}_submission.sh").read_text()
        deadline = time.monotonic() + 30
        while squeue(job_id) != ("RUNNING", 2):
            assert time.monotonic() < deadline, f"the 2-3 node job did not start on the 2 free nodes: {squeue(job_id)}"
            time.sleep(0.2)

        wait_for_ranks(run_dir, 25)
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
        first = back_again(run_dir, job_id, restart=1)
        assert squeue(job_id) == ("RUNNING", 2), "node3 is still held: the requeued job comes back on 2 nodes"
        # The uninterrupted 3-node job: it waits for node3, then runs beside the run's last attempt. Submitted
        # only now: from Slurm 24.05.5 a requeue resets the job's submit time, so a job submitted before the
        # requeue comes first among equal priorities, and this one would hold node1 and node2 for itself while
        # it waits for node3 (docs/slurm-reference.md, the generations' table).
        baseline = Baseline(
            submit_job(tmp_path / "baseline", *[a.replace(str(log), str(base_log)) for a in three]),
            tmp_path / "baseline",
        )
        assert squeue(holder_id)[0] == "RUNNING" and squeue(baseline.job_id)[0] == "PENDING"
        assert not RunDir(run_dir).growth_records(), "no growth while node3 was held"
        subprocess.run(["scancel", holder_id], check=True, timeout=30)
        assert wait_for_job(holder_id, timeout=60) == "CANCELLED"
        second = back_again(run_dir, job_id, restart=2)  # the run's own growth: no signal from here
        assert squeue(job_id)[1] == 3, "node3 is free: the job grew back to 3 nodes"
        assert wait_for_job(job_id, timeout=300) == "COMPLETED"
    finally:
        subprocess.run(["scancel", holder_id], timeout=30)
    print(f"2-3 nodes: started on 2, stopped at step {first}, back on 2, grew at {second}, back on 3 to {STEPS}")

    rd = RunDir(run_dir)
    assert [(a.nodes, a.min_nodes, a.max_nodes) for a in rd.allocation_records()] == [
        (("node1", "node2"), 2, 3),
        (("node1", "node2"), 2, 3),
        (("node1", "node2", "node3"), 2, 3),
    ]
    # Every change of the node count, from the config's 3: a start on 2, and the return on 3.
    started, grew = rd.reshape_records()
    assert started.was.startswith("3 nodes x 1 task (global batch 48") and started.onto == (
        "2 nodes x 1 task (global batch 48 = 12 a rank x 2 ranks x 2 accumulated)"
    )
    assert "asked for 2-3 nodes, got 2" in started.why and "asked for 2-3 nodes, got 3" in grew.why
    assert grew.onto.startswith("3 nodes x 1 task (global batch 48 = 16 a rank x 3 ranks x 1")
    goodput = rd.read_goodput()
    [reshape] = goodput["reshapes"]
    assert (reshape["nodes_before"], reshape["nodes_after"], reshape["in_allocation"]) == (2, 3, False), reshape
    # The growth: decided on the run's own estimate, recorded, and its real cost in the goodput ledger.
    [growth] = rd.growth_records()
    assert (growth.nodes_before, growth.nodes_expected) == (2, 3) and first < (growth.step or 0), growth
    assert growth.gain_s is not None and growth.cost_s is not None and growth.gain_s > growth.cost_s > 0
    # Counted from the step rank 0 was at, not from its progress record's (refreshed every 10 s): the steps it
    # estimated left are the steps really left when the ranks stopped, within 10% (a few steps pass between the
    # decision and the stop).
    really_left = STEPS - second
    assert growth.steps_left is not None and abs(growth.steps_left - really_left) <= 0.1 * really_left, (
        growth,
        second,
    )
    [grown] = goodput["growths"]
    assert grown["nodes_after"] == 3 and grown["cost_s"] > 0 and goodput["growth_s"] == grown["cost_s"]
    said = (run_dir / "submitit" / f"{job_id}_0_log.out").read_text()
    decision = next(line for line in said.splitlines() if "would start at once (on 2 now): growing" in line)
    print(
        f"{decision}\ndecision to the first step on 3 nodes: {grown['cost_s']:.1f} s (estimated {growth.cost_s:.1f} s);"
        f" {growth.steps_left} steps estimated left at the decision, {really_left} left at the stop (step {second})"
    )
    logs = (run_dir / "logs" / "rank_0.log").read_text()
    assert "rank table (attempt 0, 2 ranks; asked for 2-3 nodes, got 2)" in logs, logs[-2000:]
    status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert f"job {job_id} asked for 2-3 nodes, got 3" in status and "stopped to grow from 2 to 3 nodes" in status, (
        status
    )
    plot = cli("hpc_train.plot", str(run_dir), "--timeline", cwd=tmp_path)
    assert plot.returncode == 0 and (run_dir / "plots" / "timeline.png").is_file(), plot.stderr[-2000:]

    # The samples of every step are the uninterrupted job's, over three attempts on two shapes (files per
    # Slurm restart of the job: 0 and 1 on 2 nodes, in batches of 12; 2 on 3 nodes, in batches of 16).
    steps = trained_samples(log, [(job_id, 0, first, 2)], size=12, restart=0)
    steps |= trained_samples(log, [(job_id, first, second, 2)], size=12, restart=1)
    steps |= trained_samples(log, [(job_id, second, STEPS, 1)], size=RANK_BATCH, restart=2)
    assert steps == trained_samples(base_log, [(baseline.job_id, 0, STEPS, 1)])

    base_dir = baseline.ready()
    expected, got = (
        [(r["step"], r["train_loss"]) for r in read_metrics(d / "metrics.jsonl") if "train_loss" in r]
        for d in (base_dir, run_dir)
    )
    assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, STEPS + 1))
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, expected, strict=True)) < 1e-5
    final, ref = (torch.load(d / "model_final.pt", weights_only=True) for d in (run_dir, base_dir))
    difference = max((final[k] - ref[k]).abs().max().item() for k in ref)
    print(f"2 -> 2 -> 3 nodes on Slurm: max |weight difference| from the uninterrupted 3-node job {difference:.2e}")
    assert difference < 1e-6

    # Training on: both counts start now, each at the step time this run measured on it; 3 finishes first, and
    # cluster.slurm.shape=earliest_finish asks for that count.
    more = [*three, *RANGE, f"trainer.max_steps={2 * STEPS}", "cluster.slurm.shape=earliest_finish"]
    dry = cli("hpc_train", *more, "cluster.slurm.dry_run=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"({STEPS} steps left; start-up " in dry.stdout and "s (measured)" in dry.stdout, dry.stdout
    assert "earliest_finish: submitting 3 nodes, the first to finish" in dry.stdout, dry.stdout
    assert "#SBATCH --nodes=3\n" in dry.stdout
