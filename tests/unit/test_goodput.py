"""The goodput ledger's JSON: what ``status/goodput.json`` and ``jobs status --json`` have always held."""

from __future__ import annotations

import json

from hpc_train.core.goodput import GoodputLedger, ledger, pack_ledger
from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Failure, FailureKind, Growth, Progress

T = 1_000_000.0


def progress(first: int, first_time: float, step: int, at: float, ckpt: int, ckpt_time: float) -> Progress:
    return Progress(
        first_step=first, first_time=T + first_time, step=step, time=T + at, checkpoint_step=ckpt,
        checkpoint_time=T + ckpt_time,
    )  # fmt: skip


def a_run() -> GoodputLedger:
    """Job 7 asks for 2-4 nodes. Allocation 1 (0-100 s, 3 nodes): attempt 0 is killed after step 35 (checkpoint
    30); attempt 1 goes on with 2 nodes from step 30 and stops at step 70 to grow to 4. Allocation 2 (130-300 s):
    attempt 2 on 4 nodes completes step 150. A second decision to grow, at 295 s, has no attempt after it yet."""
    allocations = [
        Allocation(job_id="7", nodes=("a", "b", "c"), start=T, end=T + 100, min_nodes=2, max_nodes=4),
        Allocation(job_id="7", requeue=1, nodes=("a", "b", "c", "d"), start=T + 130, end=T + 300, min_nodes=2,
                   max_nodes=4),
    ]  # fmt: skip
    attempts = [
        AttemptRecord(attempt=0, outcome=AttemptOutcome.FAILED, job_id="7", nodes=("a", "b", "c"), ranks=3,
                      start=T + 1, end=T + 47, progress=progress(1, 11, 35, 45, 30, 40),
                      failure=Failure(kind=FailureKind.KILLED, rank=2, host="c", step=35, suspects=("c",))),
        AttemptRecord(attempt=1, outcome=AttemptOutcome.STOPPED, job_id="7", nodes=("a", "b"), ranks=2,
                      start=T + 48, end=T + 96, progress=progress(31, 56, 70, 95, 70, 95)),
        AttemptRecord(attempt=2, outcome=AttemptOutcome.COMPLETED, job_id="7", requeue=1, nodes=("a", "b", "c", "d"),
                      ranks=4, start=T + 132, end=T + 290, progress=progress(71, 140.5, 150, 285, 150, 286)),
    ]  # fmt: skip
    growths = [
        Growth(time=T + 94, job_id="7", attempt=1, step=69, nodes_before=2, nodes_expected=4, cost_s=30.0),
        Growth(time=T + 295, job_id="7", attempt=2, step=150, nodes_before=4, nodes_expected=5, cost_s=9.5),
    ]
    return ledger(allocations, attempts, now=T + 400, growths=growths)


EXPECTED = {
    "ettr": 0.8049,
    "wall_s": 270.0,
    "productive_s": 217.329,
    "lost_s": 52.671,
    "startup_s": 22.671,
    "redone_s": 12.0,
    "restart_gaps_s": 18.0,
    "allocations": 2,
    "attempts": 3,
    "failures": 1,
    "restarts": [
        {
            "after_attempt": 0,
            "class": "killed",
            "in_allocation": True,
            "latency_s": 11.0,
            "ranks_before": 3,
            "ranks_after": 2,
        }
    ],
    "reshapes": [
        {
            "after_attempt": 0,
            "in_allocation": True,
            "nodes_before": 3,
            "nodes_after": 2,
            "ranks_before": 3,
            "ranks_after": 2,
        },
        {
            "after_attempt": 1,
            "in_allocation": False,
            "nodes_before": 2,
            "nodes_after": 4,
            "ranks_before": 2,
            "ranks_after": 4,
        },
    ],
    "growths": [
        {
            "time": 1000094.0,
            "nodes_before": 2,
            "nodes_expected": 4,
            "nodes_after": 4,
            "estimated_cost_s": 30.0,
            "cost_s": 46.5,
        },
        {
            "time": 1000295.0,
            "nodes_before": 4,
            "nodes_expected": 5,
            "nodes_after": None,
            "estimated_cost_s": 9.5,
            "cost_s": None,
        },
    ],
    "growth_s": 46.5,
    "per_attempt": [
        {
            "attempt": 0,
            "job_id": "7",
            "outcome": "failed",
            "class": "killed",
            "nodes": ["a", "b", "c"],
            "ranks": 3,
            "resumed_step": 0.0,
            "last_step": 35.0,
            "kept_step": 30.0,
            "startup_s": 9.0,
            "productive_s": 30.0,
            "redone_s": 7.0,
        },
        {
            "attempt": 1,
            "job_id": "7",
            "outcome": "stopped",
            "class": None,
            "nodes": ["a", "b"],
            "ranks": 2,
            "resumed_step": 30.0,
            "last_step": 70.0,
            "kept_step": 70.0,
            "startup_s": 7.0,
            "productive_s": 40.0,
            "redone_s": 1.0,
        },
        {
            "attempt": 2,
            "job_id": "7",
            "outcome": "completed",
            "class": None,
            "nodes": ["a", "b", "c", "d"],
            "ranks": 4,
            "resumed_step": 70.0,
            "last_step": 150.0,
            "kept_step": 150.0,
            "startup_s": 6.671,
            "productive_s": 147.329,
            "redone_s": 4.0,
        },
    ],
    "updated": 1000400.0,
}


def test_the_ledger_s_json_is_the_shape_it_has_always_had() -> None:
    """Every key, in its order, with its nulls (nothing left out) and its value types (json.dumps tells 0 from
    0.0 and sees the order)."""
    got = a_run().to_json()
    assert got == EXPECTED
    assert json.dumps(got) == json.dumps(EXPECTED)


def test_the_ledger_of_nothing_keeps_its_json_too() -> None:
    """Sums of nothing stay the integer 0, as they always were written."""
    got = ledger([], [], now=5.0).to_json()
    assert json.dumps(got) == json.dumps(
        {
            "ettr": 0.0,
            "wall_s": 0,
            "productive_s": 0,
            "lost_s": 0.0,
            "startup_s": 0,
            "redone_s": 0,
            "restart_gaps_s": 0.0,
            "allocations": 0,
            "attempts": 0,
            "failures": 0,
            "restarts": [],
            "reshapes": [],
            "growths": [],
            "growth_s": 0,
            "per_attempt": [],
            "updated": 5.0,
        }
    )


def test_the_pack_ledger_s_json_names_its_job_only_when_known() -> None:
    """A member with no attempt yet (None) shares the time held but trained none of it."""
    held = [[Allocation(job_id="9_0", start=T, end=T + 300)], [Allocation(job_id="9_0", start=T + 1, end=T + 301)]]
    pack = pack_ledger(held, [a_run(), None], now=T + 400)
    expected = {"members": 2, "allocations": 1, "wall_s": 301.0, "productive_s": 217.329, "ettr": 0.361}
    assert json.dumps(pack.to_json()) == json.dumps(expected)
    named = pack_ledger(held, [a_run(), None], now=T + 400, job_id="9_0").to_json()
    assert json.dumps(named) == json.dumps(expected | {"job_id": "9_0"})
