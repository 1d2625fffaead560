"""Sixteen real nodes: the testbed grows to 16 slurmd nodes (one rank each) for one job, preempted and resumed
end to end on real srun, with the control plane at its defaults (cluster.status_every_s=10). The test measures
what the run dir's status/ folder gets while the job trains, and prints the figures the README quotes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import format_table

from ..conftest import wait_for_ranks
from .conftest import TESTBED, _nodes_idle, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

NODES = 16
STEPS = 1000
JOB = [
    "cluster=slurm",
    f"cluster.nodes={NODES}",
    "cluster.tasks_per_node=1",
    "cluster.partition=all",
    "data.num_samples=8192",
    "model.hidden_sizes=[64]",
    "trainer.batch_size=16",
    f"trainer.max_steps={STEPS}",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=10",
    "trainer.plots=false",
    "trainer.tensorboard=false",
    "trainer.progress_bar=false",
]


def _testbed(*args: str, nodes: int | None = None) -> None:
    env = {**os.environ} | ({"HPC_TESTBED_NODES": str(nodes - 1)} if nodes else {})  # + the one gpu node
    subprocess.run([str(TESTBED), *args], check=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def sixteen_nodes() -> Iterator[None]:
    """The testbed with 16 nodes (partition all: node[1-16]) for this module, then its default size again."""
    _testbed("stop")
    try:
        _testbed("start", nodes=NODES)
        yield
    finally:
        _testbed("stop", nodes=NODES)
        _testbed("start")
        deadline = time.monotonic() + 60
        while not _nodes_idle():
            assert time.monotonic() < deadline, "the default testbed did not come back idle"
            time.sleep(0.5)


def _updates(rd: RunDir, seconds: float, until_step: int) -> tuple[set[str], dict[str, int], float]:
    """The files status/ gained, how often each file in it was replaced (an atomic update is a new inode: a
    create and a rename), polled every 0.1 s, and for how long: ``seconds``, or less where the nodes' summaries
    say the job reached ``until_step`` before (the window must end while it still trains: at its end, rank 0
    writes its own status and the checkpoint ledger)."""
    status = rd.status_dir
    seen: dict[str, int] = {}
    changes: dict[str, int] = {}
    before = {p.name for p in status.iterdir()}
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline and _step(rd) < until_step:
        for path in status.iterdir():
            try:
                inode = path.stat().st_ino
            except FileNotFoundError:
                continue
            if path.name in seen and seen[path.name] != inode:
                changes[path.name] = changes.get(path.name, 0) + 1
            seen[path.name] = inode
        time.sleep(0.1)
    return {p.name for p in status.iterdir()} - before, changes, time.monotonic() - started


def _step(rd: RunDir) -> int:
    """The latest step rank 0's progress reached, as its node last reported it."""
    return max((p.step or 0 for s in rd.node_summaries() for p in s.progress), default=0)


@pytest.mark.usefixtures("sixteen_nodes")
def test_sixteen_nodes_preempted_and_resumed_with_one_status_file_per_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    job_id = submit_job(run_dir, *JOB)
    rd = RunDir(run_dir)
    wait_for_ranks(run_dir, 30, timeout=420)
    first_seen = time.monotonic() - started

    # 30 s, or until half the steps are done (as the summaries say, up to 10 s late): on an idle machine the 16
    # ranks train about 13 steps a second, and a clean-clone run of 400 steps saw the job end inside the window.
    new_files, changes, window = _updates(rd, 30.0, until_step=STEPS // 2)
    assert window >= 15.0, f"the job reached step {STEPS // 2} {window:.1f} s after step 30: too short a window"
    assert not new_files, new_files
    assert sorted(changes) == sorted(f"node_node{i}.json" for i in range(1, NODES + 1)), changes  # only these...
    per_node_per_10s = max(changes.values()) / (window / 10)
    assert per_node_per_10s <= 1.5, changes  # ...about once per 10 s (a window can hold one more than its 10 s)
    per_rank = [p.name for p in rd.status_dir.glob("rank_*.json")]
    assert per_rank == [], per_rank  # nothing per rank while it trains (rank 0 writes its own at its end)

    signalled = time.monotonic()
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=600) == "COMPLETED"
    ended = time.monotonic()

    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path).stdout)[0]
    assert status["state"] == "COMPLETED", status
    statuses = rd.rank_statuses()
    assert len(statuses) == NODES and {(s.state.value, s.attempt) for s in statuses.values()} == {("completed", 1)}
    summaries = rd.node_summaries()
    assert sorted(s.host for s in summaries) == sorted(f"node{i}" for i in range(1, NODES + 1))
    assert [p.name for p in rd.status_dir.glob("rank_*.json")] == ["rank_0.json"]
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert "resumed from" in log, log[-2000:]
    table = log[log.index("rank table (attempt 1") :].splitlines()  # a few lines, not one per rank
    assert table[1].startswith(f"{NODES} ranks on {NODES} nodes; backend gloo, MASTER_ADDR:PORT node1:"), table[:4]
    assert table[2] == f"  node[1-{NODES}]: {NODES} nodes x 1 ranks (cpu), ranks 0-{NODES - 1}", table[:4]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS and steps == sorted(set(steps)), steps  # every logged step once, across the stop

    attempts = rd.attempt_records()
    assert [a.outcome.value for a in attempts] == ["stopped", "completed"]
    resumed = attempts[1]
    first_step = (
        resumed.progress.first_time - resumed.start
        if resumed.progress and resumed.progress.first_time and resumed.start
        else None
    )
    profiles = rd.startup_profiles()
    assert len(profiles) == NODES
    slowest = {
        phase: max((p.seconds(phase) or 0.0) for p in profiles.values())
        for phase in ("interpreter", "imports", "rendezvous", "process_group", "model")
    }
    figures = [
        ["submit to step 30 seen in the statuses", f"{first_seen:.1f} s"],
        [f"status/ updates per node per 10 s ({window:.0f} s window)", f"{per_node_per_10s:.2f}"],
        ["USR2 to completed, through the requeue", f"{ended - signalled:.1f} s"],
        ["resumed attempt: its start to its first step", f"{first_step:.1f} s" if first_step else "-"],
        *[[f"slowest rank's {phase} (resumed attempt)", f"{s:.2f} s"] for phase, s in slowest.items()],
        ["files in status/ at the end", str(len(list(rd.status_dir.iterdir())))],
    ]
    print(f"\n16 nodes x 1 rank, job {job_id}:\n{format_table(['figure', 'value'], figures)}")
