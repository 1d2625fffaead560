"""A really slow node on the Slurm testbed: node2's slurmd, and so every job step it starts, runs under a CPU
quota (a cgroup, not a sleep in the product). A 2-node job of the built-in trainer names the rank on node2, with
its node, within a bound this test measures; `jobs status` and status/stragglers.json say so."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir

from ..conftest import wait_for_ranks
from .conftest import SLURM_2X1, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
STATE = Path(os.environ.get("HPC_TESTBED_DIR", "/var/lib/hpc-train-testbed"))
QUOTA = 0.25
"""node2's share of one core."""


@pytest.fixture
def slow_node2() -> Iterator[str]:
    """node2's slurmd (and the steps it starts from now on: children stay in their parent's cgroup) under
    QUOTA of a core; afterwards back in the root cgroup, with whatever it started meanwhile."""
    if not (CPU_CGROUP / "tasks").exists():
        pytest.skip("needs the cgroup v1 cpu controller")
    pid = (STATE / "run" / "slurmd-node2.pid").read_text().strip()
    group = CPU_CGROUP / f"hpc_train_slow_node2_{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(QUOTA * 100000)))
        (group / "tasks").write_text(pid)
        yield "node2"
    finally:
        for task in (group / "tasks").read_text().split():
            with suppress(OSError):  # ended meanwhile
                (CPU_CGROUP / "tasks").write_text(task)
        group.rmdir()


def test_the_rank_on_a_slow_node_is_named(tmp_path: Path, slow_node2: str) -> None:
    run_dir = tmp_path / "run"
    job_id = submit_job(
        run_dir,
        *SLURM_2X1,
        "trainer.max_steps=1000000",
        "trainer.max_epochs=0",
        "trainer.val_every_n_epochs=0",
        "trainer.plots=false",
        "trainer.progress_bar=false",
        "cluster.stragglers.window_s=2",
        "cluster.stragglers.windows=3",
    )
    try:
        wait_for_ranks(run_dir, 1, timeout=240)
        trains = time.monotonic()
        found = None
        while found is None and time.monotonic() - trains < 120:
            time.sleep(1)
            named = [e for e in RunDir(run_dir).straggler_reports() if e.ranks]
            found = named[-1] if named else None
        named_after = time.monotonic() - trains
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
