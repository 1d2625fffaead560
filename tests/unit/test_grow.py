"""Grow when more frees up (``hpc_train.runtime.grow``): the estimate, its figures and their sources, Slurm asked
through stand-in commands, and the goodput ledger's measure of a growth. The whole of it runs on the real testbed
in tests/integration/test_queue_shape_slurm.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpc_train.core.goodput import ledger
from hpc_train.core.records import Allocation, AttemptRecord, Growth, Progress, RequeueEntry
from hpc_train.runtime.grow import (
    Estimate,
    checkpoint_cost_s,
    estimate,
    larger_count,
    requeue_gap_s,
    requeue_goes_behind,
)
from hpc_train.tools.api import compose_config

RANGE = ["cluster=slurm", "cluster.nodes=4", "cluster.min_nodes=1", "trainer.max_steps=1000", "trainer.max_epochs=0"]


def figures(**changes: object) -> Estimate:
    base: dict[str, object] = {
        "nodes_now": 2,
        "nodes_after": 4,
        "steps_left": 100,
        "step_s_now": 1.0,
        "step_s_after": 0.5,
        "after_source": "linear from 2 (measured)",
        "checkpoint_s": 2.0,
        "checkpoint_source": "median of 1 stop",
        "gap_s": 6.0,
        "gap_source": "median of this run's 1 requeue",
        "startup_s": 12.0,
        "startup_source": "measured",
    }
    return Estimate(**{**base, **changes})  # type: ignore[arg-type]


def test_growing_is_worth_it_when_the_steps_left_gain_more_than_the_move_costs() -> None:
    worth = figures()
    assert (worth.gain_s, worth.cost_s, worth.worth) == (50.0, 20.0, True)
    assert worth.describe().startswith("4 nodes would start at once (on 2 now): growing. Gain 50 s (100 steps left")
    assert "cost 20 s (checkpoint 2 s: median of 1 stop; requeue gap 6 s: median of this run's 1 requeue" in (
        worth.describe()
    )
    late = figures(steps_left=30)  # 15 s to gain, 20 s to pay: stay
    assert not late.worth and "not worth it; staying" in late.describe()
    record = worth.record("12", 3, 900, 1000.0)
    assert (record.nodes_before, record.nodes_expected, record.gain_s, record.cost_s) == (2, 4, 50.0, 20.0)
    assert Growth.from_json(record.to_json()) == record


def fake(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text(f"#!{sys.executable}\n{body}")
    (bindir / name).chmod(0o755)


def test_the_requeue_gap_is_measured_else_slurms_cred_expire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    fake(bindir, "scontrol", "print('AuthType = auth/munge\\nAuthInfo = cred_expire=5,socket=/run/m')\n")
    assert requeue_gap_s([]) == (6.0, "this cluster's cred_expire (5 s) + 1 s")
    fake(bindir, "scontrol", "print('AuthInfo = (null)')\n")
    assert requeue_gap_s([]) == (121.0, "Slurm's default cred_expire (120 s) + 1 s")
    allocations = [
        Allocation(job_id="7", start=0.0, end=100.0),
        Allocation(job_id="7", requeue=1, start=108.0, end=200.0),
        Allocation(job_id="9", start=900.0, end=None),  # another job (a resubmission): not a requeue's gap
    ]
    assert requeue_gap_s(allocations) == (8.0, "median of this run's 1 requeue")
    assert checkpoint_cost_s([]) == (0.0, "not measured yet")
    assert checkpoint_cost_s([RequeueEntry(attempt=0, signal=12, stop_saved_s=1.5)]) == (1.5, "median of 1 stop")


SBATCH = """\
import sys
args = sys.argv[1:]
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(" ".join(args[:-1]) + "\\n")
missing = int(next(a for a in args if a.startswith("--nodes=")).split("=")[1])
when = "2020-01-01T00:00:00" if missing <= 1 else "2999-01-01T00:00:00"  # one more node is free now
print(f"sbatch: Job 3 to start at {when} using 1 processors on nodes x in partition p", file=sys.stderr)
"""


def test_the_largest_count_whose_missing_nodes_start_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    fake(bindir, "sbatch", SBATCH)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    cfg = compose_config(*RANGE, "cluster.slurm.exclude=node9", "trainer.batch_size=48")
    # On 2 of 4: a job of 2 more nodes would wait, of 1 more would start now (the global batch of 4 x 48 splits
    # over 3 nodes too). The job's own nodes and the user's exclude are left out of Slurm's answer.
    assert larger_count(cfg, script, ["node1", "node2"], 2) == 3
    calls = (bindir / "sbatch.calls").read_text().splitlines()
    assert calls == [
        "--test-only --nodes=2 --exclude=node1,node2,node9",
        "--test-only --nodes=1 --exclude=node1,node2,node9",
    ]
    assert larger_count(cfg, script, ["node1", "node2", "node3"], 3) == 4
    assert larger_count(cfg, script, ["node1", "node2", "node3", "node4"], 4) is None  # nothing larger to grow to
    assert len((bindir / "sbatch.calls").read_text().splitlines()) == 3
    # 256 does not split over 3 nodes of one rank: from 2 the only larger count is 4, and it waits.
    assert larger_count(compose_config(*RANGE, "trainer.batch_size=64"), script, ["node1", "node2"], 2) is None


def test_the_estimate_uses_this_attempts_pace_and_the_runs_history() -> None:
    cfg = compose_config(*RANGE)
    pace = Progress(first_step=201, first_time=1000.0, step=401, time=1200.0)  # 1 s a step on 2 nodes
    attempts = [
        AttemptRecord.from_json(
            {"attempt": 0, "outcome": "stopped", "start": 980.0, "nodes": ["a", "b"], "progress": pace.to_json()}
        )
    ]
    found = estimate(cfg, attempts, pace, (2, 4), (6.0, "measured"), (1.0, "median of 1 stop"), now=1200.0)
    assert found is not None
    assert (found.steps_left, found.step_s_now, found.step_s_after) == (599, 1.0, 0.5)
    assert (found.startup_s, found.gap_s, found.checkpoint_s) == (20.0, 6.0, 1.0) and found.worth
    first = Progress(first_step=5, first_time=1.0, step=5, time=1.0)  # one step: no pace yet
    assert estimate(cfg, attempts, first, (2, 4), (6.0, ""), (0.0, "")) is None


def test_the_estimate_counts_from_the_step_rank_0_is_at_now_not_the_one_its_record_last_said() -> None:
    """The progress record is refreshed every cluster.status_every_s (10 s by default): 10 s after it was written,
    at 0.02 s a step, rank 0 is 500 steps further, and those are not left to gain from."""
    cfg = compose_config(*RANGE)
    pace = Progress(first_step=1, first_time=1000.0, step=201, time=1004.0)  # 0.02 s a step
    found = estimate(cfg, [], pace, (2, 4), (6.0, "measured"), (1.0, "median of 1 stop"), now=1014.0)
    assert found is not None
    assert (found.step, found.steps_left) == (701, 299), found
    said = found.describe()
    assert "299 steps left from step 701 (rank 0's progress record: step 201, 10.0 s old, carried forward 500" in (said)
    assert found.record("12", 0, found.step, 1014.0).step == 701
    fresh = estimate(cfg, [], pace, (2, 4), (6.0, "measured"), (1.0, "median of 1 stop"), now=1004.0)
    assert fresh is not None and (fresh.step, fresh.steps_left) == (201, 799)
    assert "from step 201 (rank 0's progress record, written just now)" in fresh.describe()
    late = estimate(cfg, [], pace, (2, 4), (6.0, ""), (1.0, ""), now=1100.0)  # past the end: nothing left to gain
    assert late is not None and late.steps_left == 0 and not late.worth


def test_the_ledger_measures_each_growth_from_the_decision_to_the_first_step_on_more_nodes() -> None:
    allocations = [Allocation(job_id="7", start=0.0, end=60.0), Allocation(job_id="7", requeue=1, start=66.0, end=None)]
    before = AttemptRecord.from_json(
        {
            "attempt": 0,
            "outcome": "stopped",
            "job_id": "7",
            "nodes": ["a", "b"],
            "ranks": 2,
            "start": 1.0,
            "end": 59.0,
            "progress": {"first_step": 1, "first_time": 5.0, "step": 100, "time": 58.0},
        }
    )
    after = AttemptRecord.from_json(
        {
            "attempt": 1,
            "outcome": "running",
            "job_id": "7",
            "requeue": 1,
            "nodes": ["a", "b", "c", "d"],
            "ranks": 4,
            "start": 67.0,
            "progress": {"first_step": 101, "first_time": 72.5, "step": 150, "time": 90.0},
        }
    )
    growth = Growth(time=57.5, job_id="7", attempt=0, step=98, nodes_before=2, nodes_expected=4, cost_s=12.0)
    book = ledger(allocations, [before, after], now=100.0, growths=[growth])
    assert [g.to_json() for g in book.growths] == [
        {
            "time": 57.5,
            "nodes_before": 2,
            "nodes_expected": 4,
            "nodes_after": 4,
            "estimated_cost_s": 12.0,
            "cost_s": 15.0,
        }
    ]
    assert book.growth_s == 15.0
    assert book.reshapes[0].nodes_after == 4
    assert ledger(allocations, [before, after], now=100.0).growths == ()


def test_a_requeue_goes_behind_the_queue_as_the_job_showed_else_as_its_slurm_version_says() -> None:
    """From Slurm 24.05.5 a requeue resets the job's submit time (seen on the testbed's 24.11.5): a growth would
    put the job behind every job waiting then, with its own nodes free for them. 22.05 keeps it (the testbed)."""
    first = 1_000_000.0
    assert requeue_goes_behind("24.11.5", None, None, requeued=False)[0]
    assert requeue_goes_behind("24.05.5", None, first, requeued=False)[0]
    assert not requeue_goes_behind("24.05.4", None, first, requeued=False)[0]
    assert not requeue_goes_behind("22.05.8", None, first, requeued=False)[0]
    assert requeue_goes_behind(None, None, first, requeued=False) == (False, "the Slurm version is not known here")
    # Once requeued, what the job itself showed decides, whatever the version says.
    moved = requeue_goes_behind("22.05.8", first + 60, first, requeued=True)
    assert moved == (True, "seen on this job: its requeue moved its submit time to the requeue")
    assert not requeue_goes_behind("24.11.5", first - 5, first, requeued=True)[0]
