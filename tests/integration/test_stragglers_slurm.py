"""A really slow node on the Slurm testbed: node2's slurmd, and so every job step it starts, runs under a CPU
quota (a cgroup, not a sleep in the product). A 2-node job of the built-in trainer names the rank on node2, with
its node, within a bound this test measures; `jobs status` and status/stragglers.json say so."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir

from ..conftest import wait_for_ranks, wait_for_verdict
from .conftest import SLURM_2X1, SLURM_2X2, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
STATE = Path(os.environ.get("HPC_TESTBED_DIR", "/var/lib/hpc-train-testbed"))
LONG = [
    *SLURM_2X1,
    "trainer.max_steps=1000000",
    "trainer.max_epochs=0",
    "trainer.val_every_n_epochs=0",
    "trainer.plots=false",
    "trainer.progress_bar=false",
    "cluster.stragglers.window_s=2",
    "cluster.stragglers.windows=3",
]
"""A 2 x 1 job that trains until cancelled, judged every 2 s, 3 windows in a row."""
QUOTA = 0.25
"""node2's share of one core."""


@contextmanager
def _slowed(node: str, quota: float) -> Iterator[str]:
    """``node``'s slurmd (and the steps it starts from now on: children stay in their parent's cgroup) under
    ``quota`` of a core; afterwards back in the root cgroup, with whatever it started meanwhile."""
    if not (CPU_CGROUP / "tasks").exists():
        pytest.skip("needs the cgroup v1 cpu controller")
    pid = (STATE / "run" / f"slurmd-{node}.pid").read_text().strip()
    group = CPU_CGROUP / f"hpc_train_slow_{node}_{os.getpid()}"
    group.mkdir()
    try:
        # 10 ms periods: slices shorter than a step's forward and backward (with 100 ms periods the compute fits
        # in one slice and the pauses fall where the rank waits for the others: see tests/runs/test_stragglers.py)
        (group / "cpu.cfs_period_us").write_text("10000")
        (group / "cpu.cfs_quota_us").write_text(str(int(quota * 10000)))
        (group / "tasks").write_text(pid)
        yield node
    finally:
        for task in (group / "tasks").read_text().split():
            with suppress(OSError):  # ended meanwhile
                (CPU_CGROUP / "tasks").write_text(task)
        group.rmdir()


@pytest.fixture
def slow_node2() -> Iterator[str]:
    """node2 under QUOTA of a core."""
    with _slowed("node2", QUOTA) as node:
        yield node


def test_the_rank_on_a_slow_node_is_named(tmp_path: Path, slow_node2: str) -> None:
    run_dir = tmp_path / "run"
    job_id = submit_job(
        run_dir,
        *LONG,
    )
    try:
        wait_for_ranks(run_dir, 1, timeout=240)
        found, named_after = wait_for_verdict(run_dir, bool, timeout=120)
        status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path)
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=30)
        wait_for_job(job_id, timeout=120)
    assert found is not None, f"the rank on {slow_node2} was never named: {RunDir(run_dir).straggler_reports()}"
    (slow,) = found.ranks
    assert (slow.host, slow.rank) == (slow_node2, 1) and slow.slowdown >= 1.25, found
    assert "stragglers (own compute time" in status.stdout and f"rank 1 ({slow_node2}, cpu)" in status.stdout
    print(
        f"\nnamed {named_after:.1f} s after every rank's first step (2 s windows, 3 in a row), node2 at "
        f"{QUOTA:.0%} of a core: {found.describe()}"
    )


HALF_QUOTA = 0.7
"""node2's share of one core in the 2 x 2 job: its two ranks share it, node1's two share what the machine's two
cores have left."""


def test_a_whole_slow_node_of_two_is_named_rank_by_rank(tmp_path: Path) -> None:
    """Issue 59: a 2 x 2 job with node2 slow. Half the ranks are slow, so the median of every rank's time sat
    between the slow and the fast ones and moved with the slow node; each rank against the median of the others
    is compared with the fast node's."""
    with _slowed("node2", HALF_QUOTA) as slow_node:
        run_dir = tmp_path / "run"
        job_id = submit_job(run_dir, *[a for a in LONG if a not in SLURM_2X1], *SLURM_2X2)
        try:
            wait_for_ranks(run_dir, 1, timeout=240)
            found, named_after = wait_for_verdict(run_dir, lambda named: named == {2, 3}, timeout=120)
            reports = RunDir(run_dir).straggler_reports()
        finally:
            subprocess.run(["scancel", job_id], check=False, timeout=30)
            wait_for_job(job_id, timeout=120)
    assert found is not None, f"node2's ranks were never both named: {[e.describe() for e in reports]}"
    assert {(r.host, r.rank) for r in found.ranks} == {(slow_node, 2), (slow_node, 3)}, found
    assert all(r.slowdown >= 1.25 for r in found.ranks) and not any(r.rank < 2 for e in reports for r in e.ranks)
    print(
        f"\nnode2 of 2 at {HALF_QUOTA:.0%} of a core for its 2 ranks: both named {named_after:.1f} s after every "
        f"rank's first step (2 s windows, 3 in a row): {found.describe()}"
    )


def test_a_node_that_stays_slow_is_left_for_the_spare(tmp_path: Path, slow_node2: str) -> None:
    """cluster.stragglers.replace_after_s with a spare: the supervisor blames the slow node, stops the step (the
    ranks checkpoint, nothing is requeued) and trains on in the same allocation on the spare, from that step."""
    run_dir = tmp_path / "run"
    job_id = submit_job(
        run_dir,
        *LONG,
        "cluster.partition=all",  # node[1-3]: two to train on, one spare
        "cluster.slurm.spare_nodes=1",
        "cluster.stragglers.replace_after_s=4",
    )
    rd = RunDir(run_dir)
    try:
        deadline = time.monotonic() + 300
        while len(rd.attempt_records()) < 2 or not rd.progress_record(0).step:
            assert time.monotonic() < deadline, f"no second attempt: {rd.attempt_records()}"
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=30)
        wait_for_job(job_id, timeout=120)
    first, second = rd.attempt_records()[:2]
    assert first.outcome.value == "stopped" and slow_node2 in first.nodes, first
    assert slow_node2 not in second.nodes and len(second.nodes) == 2, second
    (bad,) = rd.bad_node_records()
    assert bad.host == slow_node2 and bad.why.startswith("straggler: rank 1 (node2"), bad
    assert rd.requeue_records() == []  # stopped for the supervisor, not requeued
    assert not rd.restart_request.exists()
    stopped = first.progress.step if first.progress else None
    assert stopped and second.progress and second.progress.first_step == stopped + 1, (first, second)
    slow = next(r for e in rd.straggler_reports() for r in e.ranks if r.host == slow_node2)
    resumed = second.progress.first_time - (first.end or 0.0)
    print(
        f"\nattempt 0 on {','.join(first.nodes)} stopped {(first.end or 0.0) - (slow.since_time or 0.0):.1f} s after "
        f"{slow_node2}'s first slow window (replace_after_s=4; the supervisor reads the verdicts every 10 s); attempt 1 "
        f"on {','.join(second.nodes)} made its first step {resumed:.1f} s after attempt 0 ended"
    )
