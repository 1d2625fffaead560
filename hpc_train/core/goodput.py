"""The goodput ledger: how much of the time a run held its allocations went into steps it kept.

Inputs, all in the run dir: the allocations (``status/allocations.json``: each Slurm job's start and end, one
per requeue), the attempts the supervisor ran (``status/attempts.json``: start, end, outcome) and each
attempt's progress (rank 0's first and latest step with their wall-clock times, and its latest checkpoint).

For each attempt the ledger finds the step the run kept from it: the step the next attempt resumed from, or
its last step when it completed (or still runs). Then, in seconds:

- ``startup_s``: from the attempt's start to when its first step began
- ``productive_s``: from there to the time it reached the kept step
- ``redone_s``: the rest of the attempt: steps after the last checkpoint, which the next attempt does again,
  and the teardown after a failure
- ``restart_gaps_s``: allocated time outside every attempt: between a failed attempt's end and the next one's
  start, and the supervisor's own start and end

``ettr`` (effective training time ratio) = productive time / allocated time, in [0, 1].
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Growth, Progress

__all__ = ["ledger", "pack_ledger", "step_seconds"]


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _resumed(progress: Progress | None) -> float | None:
    """The step an attempt resumed from (None before it reported a step)."""
    first = None if progress is None else _float(progress.first_step)
    return None if first is None else first - 1


@dataclass(frozen=True)
class _Steps:
    """The steps of an attempt that made one: its first and latest with their times, and its latest checkpoint;
    the time of any step in between is interpolated."""

    first_step: float
    first_time: float
    step: float
    time: float
    checkpoint_step: float | None
    checkpoint_time: float | None

    @staticmethod
    def of(progress: Progress | None) -> _Steps | None:
        """None for an attempt that made no step (first_time 0: none yet)."""
        if progress is None:
            return None
        first_step, first_time, step, at = progress.first_step, progress.first_time, progress.step, progress.time
        if first_step is None or not first_time or step is None or at is None:
            return None
        return _Steps(
            first_step=float(first_step),
            first_time=float(first_time),
            step=float(step),
            time=float(at),
            checkpoint_step=_float(progress.checkpoint_step),
            checkpoint_time=progress.checkpoint_time,
        )

    @property
    def resumed(self) -> float:
        return self.first_step - 1

    @property
    def step_s(self) -> float:
        """The mean time of one step (0 when only one was made)."""
        if self.step <= self.first_step:
            return 0.0
        return (self.time - self.first_time) / (self.step - self.first_step)

    @property
    def began(self) -> float:
        """When the first step began."""
        return self.first_time - self.step_s

    def time_of(self, step: float) -> float:
        if self.checkpoint_step == step and self.checkpoint_time is not None:
            return self.checkpoint_time
        if step >= self.step:
            return self.time
        return self.first_time + (step - self.first_step) * self.step_s


def _grown(growth: Growth, attempts: Sequence[AttemptRecord]) -> dict[str, Any]:
    """A growth as it came out: the first attempt after the decision, its node count and first step."""
    after = next((a for a in attempts if (a.start or 0.0) > growth.time), None)
    first = after.progress.first_time if after is not None and after.progress is not None else None
    return {
        "time": growth.time,
        "nodes_before": growth.nodes_before,
        "nodes_expected": growth.nodes_expected,
        "nodes_after": len(after.nodes) if after is not None else None,
        "estimated_cost_s": growth.cost_s,
        "cost_s": round(first - growth.time, 3) if first else None,
    }


def step_seconds(progress: Progress | None) -> float | None:
    """The mean time of one step of an attempt (None before it made two)."""
    steps = _Steps.of(progress)
    return steps.step_s if steps is not None and steps.step > steps.first_step else None


def _kept(steps: _Steps | None, attempt: AttemptRecord, after: AttemptRecord | None) -> float | None:
    """The step the run kept from this attempt."""
    if steps is None:
        return None
    resumed = _resumed(after.progress) if after is not None else None
    if resumed is not None:
        return min(resumed, steps.step)
    if attempt.end is None or attempt.outcome in (AttemptOutcome.COMPLETED, AttemptOutcome.STOPPED):
        return steps.step
    return steps.checkpoint_step if steps.checkpoint_step is not None else steps.resumed


def _until(end: float | None, now: float) -> float:
    """An end time; ``now`` where there is none yet (what is still running ends now)."""
    return now if end is None else end


def ledger(
    allocations: Sequence[Allocation],
    attempts: Sequence[AttemptRecord],
    now: float | None = None,
    growths: Sequence[Growth] = (),
) -> dict[str, Any]:
    """The ledger of a run (what ``status/goodput.json`` holds); ``growths``: its stops to come back on more
    nodes, whose cost is a category of its own (``growth_s``)."""
    now = time.time() if now is None else now
    wall = sum(max(0.0, _until(a.end, now) - a.start) for a in allocations)
    rows: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    for i, attempt in enumerate(attempts):
        after = attempts[i + 1] if i + 1 < len(attempts) else None
        steps = _Steps.of(attempt.progress)
        start = now if attempt.start is None else attempt.start
        end = _until(attempt.end, now)
        kept = _kept(steps, attempt, after)
        if steps is not None:
            startup = min(max(0.0, steps.began - start), end - start)
            productive = 0.0
            if kept is not None and kept > steps.resumed:
                productive = min(max(0.0, steps.time_of(kept) - steps.began), end - start - startup)
        else:
            startup, productive = end - start, 0.0
        failure = attempt.failure
        rows.append(
            {
                "attempt": attempt.attempt,
                "job_id": attempt.job_id,
                "outcome": attempt.outcome.value,
                "class": failure.kind if failure is not None else None,
                "nodes": list(attempt.nodes),
                "ranks": attempt.ranks,
                "resumed_step": _resumed(attempt.progress),
                "last_step": _float(attempt.progress.step) if attempt.progress is not None else None,
                "kept_step": kept,
                "startup_s": round(startup, 3),
                "productive_s": round(productive, 3),
                "redone_s": round(max(0.0, end - start - startup - productive), 3),
            }
        )
        after_steps = _Steps.of(after.progress) if after is not None else None
        if failure is not None and after is not None and after_steps is not None:
            restarts.append(
                {
                    "after_attempt": attempt.attempt,
                    "class": failure.kind,
                    "in_allocation": after.allocation == attempt.allocation,
                    "latency_s": round(after_steps.first_time - (steps.time if steps is not None else start), 3),
                    # Fewer after than before: the job went on with the nodes that were left (cluster.min_nodes).
                    "ranks_before": attempt.ranks,
                    "ranks_after": after.ranks,
                }
            )
    reshapes = [
        {
            "after_attempt": before.attempt,
            "in_allocation": after.allocation == before.allocation,
            "nodes_before": len(before.nodes),
            "nodes_after": len(after.nodes),
            "ranks_before": before.ranks,
            "ranks_after": after.ranks,
        }
        for before, after in itertools.pairwise(attempts)
        if before.ranks and after.ranks and before.ranks != after.ranks
    ]
    grown = [_grown(g, attempts) for g in growths]
    productive = sum(r["productive_s"] for r in rows)
    startup = sum(r["startup_s"] for r in rows)
    redone = sum(r["redone_s"] for r in rows)
    in_attempts = startup + productive + redone
    return {
        "ettr": round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
        "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "lost_s": round(max(0.0, wall - productive), 3),
        "startup_s": round(startup, 3),
        "redone_s": round(redone, 3),
        "restart_gaps_s": round(max(0.0, wall - in_attempts), 3),
        "allocations": len(allocations),
        "attempts": len(attempts),
        "failures": sum(1 for a in attempts if a.failure is not None),
        "restarts": restarts,
        # Every change of the rank count from one attempt to the next: nodes lost (cluster.min_nodes), or a job
        # that asks for a node range given another count after a requeue.
        "reshapes": reshapes,
        # Each stop to come back on more nodes (cluster.slurm.grow_every_min): from the decision to the first step on
        # the nodes the requeued job got. Its parts are counted above too (the stop, the queue, the start-up).
        "growths": grown,
        "growth_s": round(sum(g["cost_s"] for g in grown if g["cost_s"] is not None), 3),
        "per_attempt": rows,
        "updated": now,
    }


def pack_ledger(
    allocations: Sequence[Sequence[Allocation]], ledgers: Sequence[Mapping[str, Any]], now: float | None = None
) -> dict[str, Any]:
    """The ledger of a pack (``cluster.pack``) from its members' own: each member's ``allocations`` (the same
    jobs, each as long as that member's supervisor held it) and ``ledgers``. The pack's wall is the time its
    jobs were held (an allocation from its first member's start to its last one's end); its ETTR is the
    members' productive time over what the pack held for all of them (members x wall)."""
    now = time.time() if now is None else now
    spans: dict[tuple[str, int], tuple[float, float]] = {}
    for member in allocations:
        for a in member:
            start, end = spans.get(a.allocation, (a.start, _until(a.end, now)))
            spans[a.allocation] = (min(start, a.start), max(end, _until(a.end, now)))
    wall = sum(max(0.0, end - start) for start, end in spans.values())
    productive = sum(float(g.get("productive_s", 0.0)) for g in ledgers)
    held = wall * len(ledgers)
    return {
        "members": len(ledgers),
        "allocations": len(spans),
        "wall_s": round(wall, 3),
        "productive_s": round(productive, 3),
        "ettr": round(min(1.0, productive / held), 4) if held > 0 else 0.0,
    }
