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

The ledger is a ``GoodputLedger`` (a pack's, ``PackLedger``); ``to_json`` gives what ``status/goodput.json``
and ``jobs status --json`` hold.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, FailureKind, Growth, Progress

__all__ = [
    "AttemptTimes",
    "GoodputLedger",
    "GrowthCost",
    "PackLedger",
    "Restart",
    "ShapeChange",
    "ledger",
    "pack_ledger",
    "step_seconds",
]


@dataclass(frozen=True, kw_only=True)
class AttemptTimes:
    """Where one attempt's time went (an entry of the ledger's ``per_attempt``)."""

    attempt: int
    """The attempt's number."""
    job_id: str
    """The Slurm job it ran in."""
    outcome: AttemptOutcome
    """What it came to."""
    failure: FailureKind | None
    """What it failed of (JSON ``class``); None when it did not fail."""
    nodes: tuple[str, ...]
    """The hosts it ran on."""
    ranks: int | None
    """How many ranks it ran (None in records written before it was kept)."""
    resumed_step: float | None
    """The step it resumed from (None before it reported a step)."""
    last_step: float | None
    """The latest step it reported (None: none)."""
    kept_step: float | None
    """The step the run kept from it: the one the next attempt resumed from, or its last when it completed."""
    startup_s: float
    """Seconds from its start to when its first step began."""
    productive_s: float
    """Seconds from there to when it reached the kept step."""
    redone_s: float
    """Seconds of the rest: steps after the last checkpoint, done again by the next attempt, and a teardown."""

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "job_id": self.job_id,
            "outcome": self.outcome.value,
            "class": None if self.failure is None else self.failure.value,
            "nodes": list(self.nodes),
            "ranks": self.ranks,
            "resumed_step": self.resumed_step,
            "last_step": self.last_step,
            "kept_step": self.kept_step,
            "startup_s": self.startup_s,
            "productive_s": self.productive_s,
            "redone_s": self.redone_s,
        }


@dataclass(frozen=True, kw_only=True)
class Restart:
    """A failed attempt and the attempt after it that made a step: how long the run took to train again."""

    after_attempt: int
    """The failed attempt's number."""
    failure: FailureKind
    """What it failed of (JSON ``class``)."""
    in_allocation: bool
    """The next attempt ran in the same allocation (not after a requeue)."""
    latency_s: float
    """Seconds from the failed attempt's latest step (its start, when it made none) to the next one's first."""
    ranks_before: int | None
    """The failed attempt's rank count and the next one's: fewer after than before when the job went on with the
    nodes that were left (``cluster.min_nodes``); None in records written before it was kept."""
    ranks_after: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "after_attempt": self.after_attempt,
            "class": self.failure.value,
            "in_allocation": self.in_allocation,
            "latency_s": self.latency_s,
            "ranks_before": self.ranks_before,
            "ranks_after": self.ranks_after,
        }


@dataclass(frozen=True, kw_only=True)
class ShapeChange:
    """A change of the rank count from one attempt to the next: nodes lost (``cluster.min_nodes``), or a job that
    asks for a node range given another count after a requeue."""

    after_attempt: int
    """The number of the attempt before the change."""
    in_allocation: bool
    """The two attempts ran in the same allocation."""
    nodes_before: int
    """The node count of the attempt before the change, and of the one after it."""
    nodes_after: int
    ranks_before: int
    """The rank count of the attempt before the change, and of the one after it."""
    ranks_after: int

    def to_json(self) -> dict[str, Any]:
        return {
            "after_attempt": self.after_attempt,
            "in_allocation": self.in_allocation,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "ranks_before": self.ranks_before,
            "ranks_after": self.ranks_after,
        }


@dataclass(frozen=True, kw_only=True)
class GrowthCost:
    """A stop to come back on more nodes (``cluster.slurm.grow_every_min``), as it came out: the first attempt
    after the decision, its node count and first step."""

    time: float
    """When the supervisor decided (a time stamp)."""
    nodes_before: int
    """The node count before the stop."""
    nodes_expected: int
    """The node count that would have started at once."""
    nodes_after: int | None
    """The node count of the first attempt after the decision (None before there is one)."""
    estimated_cost_s: float | None
    """The supervisor's estimate of the cost, in seconds."""
    cost_s: float | None
    """Seconds from the decision to the first step on the nodes the requeued job got (None before that step)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "nodes_before": self.nodes_before,
            "nodes_expected": self.nodes_expected,
            "nodes_after": self.nodes_after,
            "estimated_cost_s": self.estimated_cost_s,
            "cost_s": self.cost_s,
        }


@dataclass(frozen=True, kw_only=True)
class GoodputLedger:
    """The goodput ledger of a run (``status/goodput.json``): where the time it held its allocations went."""

    ettr: float
    """Productive time / allocated time, in [0, 1] (0 with no allocated time)."""
    wall_s: float
    """Seconds of allocated time: the allocations' spans (what still runs, until now)."""
    productive_s: float
    """Seconds of the attempts' productive time."""
    lost_s: float
    """Seconds of allocated time that were not productive."""
    startup_s: float
    """Seconds of the attempts' start-ups."""
    redone_s: float
    """Seconds of the attempts' work done again (and teardowns)."""
    restart_gaps_s: float
    """Seconds of allocated time outside every attempt."""
    allocations: int
    """How many allocations the run held."""
    attempts: int
    """How many attempts the supervisor ran."""
    failures: int
    """How many of them failed."""
    restarts: tuple[Restart, ...]
    """Each failed attempt followed by one that made a step."""
    reshapes: tuple[ShapeChange, ...]
    """Every change of the rank count from one attempt to the next."""
    growths: tuple[GrowthCost, ...]
    """Each stop to come back on more nodes, from the decision to the first step on the nodes the requeued job
    got. Its parts are counted above too (the stop, the queue, the start-up)."""
    growth_s: float
    """Seconds the growths cost, those with a first step after them."""
    per_attempt: tuple[AttemptTimes, ...]
    """Each attempt's times, oldest first."""
    updated: float
    """When the ledger was made (a time stamp): the "now" that ends what still runs."""

    def to_json(self) -> dict[str, Any]:
        return {
            "ettr": self.ettr,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "lost_s": self.lost_s,
            "startup_s": self.startup_s,
            "redone_s": self.redone_s,
            "restart_gaps_s": self.restart_gaps_s,
            "allocations": self.allocations,
            "attempts": self.attempts,
            "failures": self.failures,
            "restarts": [r.to_json() for r in self.restarts],
            "reshapes": [r.to_json() for r in self.reshapes],
            "growths": [g.to_json() for g in self.growths],
            "growth_s": self.growth_s,
            "per_attempt": [r.to_json() for r in self.per_attempt],
            "updated": self.updated,
        }


@dataclass(frozen=True, kw_only=True)
class PackLedger:
    """The goodput ledger of a pack (``cluster.pack``): the time its jobs were held for all its members, and how
    much of it they trained."""

    members: int
    """How many members the pack has."""
    allocations: int
    """How many allocations its jobs held."""
    wall_s: float
    """Seconds its jobs were held: each allocation from its first member's start to its last one's end."""
    productive_s: float
    """Seconds of the members' productive time, all together."""
    ettr: float
    """The members' productive time over what the pack held for all of them (members x wall), in [0, 1]."""
    job_id: str | None = None
    """The pack's Slurm job (``jobs status``); left out of the JSON when None."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "members": self.members,
            "allocations": self.allocations,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "ettr": self.ettr,
        }
        if self.job_id is not None:
            out["job_id"] = self.job_id
        return out


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


def _grown(growth: Growth, attempts: Sequence[AttemptRecord]) -> GrowthCost:
    """A growth as it came out: the first attempt after the decision, its node count and first step."""
    after = next((a for a in attempts if (a.start or 0.0) > growth.time), None)
    first = after.progress.first_time if after is not None and after.progress is not None else None
    return GrowthCost(
        time=growth.time,
        nodes_before=growth.nodes_before,
        nodes_expected=growth.nodes_expected,
        nodes_after=len(after.nodes) if after is not None else None,
        estimated_cost_s=growth.cost_s,
        cost_s=round(first - growth.time, 3) if first else None,
    )


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
) -> GoodputLedger:
    """The ledger of a run (what ``status/goodput.json`` holds); ``growths``: its stops to come back on more
    nodes, whose cost is a category of its own (``growth_s``)."""
    now = time.time() if now is None else now
    wall = sum(max(0.0, _until(a.end, now) - a.start) for a in allocations)
    rows: list[AttemptTimes] = []
    restarts: list[Restart] = []
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
            AttemptTimes(
                attempt=attempt.attempt,
                job_id=attempt.job_id,
                outcome=attempt.outcome,
                failure=failure.kind if failure is not None else None,
                nodes=attempt.nodes,
                ranks=attempt.ranks,
                resumed_step=_resumed(attempt.progress),
                last_step=_float(attempt.progress.step) if attempt.progress is not None else None,
                kept_step=kept,
                startup_s=round(startup, 3),
                productive_s=round(productive, 3),
                redone_s=round(max(0.0, end - start - startup - productive), 3),
            )
        )
        after_steps = _Steps.of(after.progress) if after is not None else None
        if failure is not None and after is not None and after_steps is not None:
            restarts.append(
                Restart(
                    after_attempt=attempt.attempt,
                    failure=failure.kind,
                    in_allocation=after.allocation == attempt.allocation,
                    latency_s=round(after_steps.first_time - (steps.time if steps is not None else start), 3),
                    ranks_before=attempt.ranks,
                    ranks_after=after.ranks,
                )
            )
    reshapes = tuple(
        ShapeChange(
            after_attempt=before.attempt,
            in_allocation=after.allocation == before.allocation,
            nodes_before=len(before.nodes),
            nodes_after=len(after.nodes),
            ranks_before=before.ranks,
            ranks_after=after.ranks,
        )
        for before, after in itertools.pairwise(attempts)
        if before.ranks and after.ranks and before.ranks != after.ranks
    )
    grown = tuple(_grown(g, attempts) for g in growths)
    productive = sum(r.productive_s for r in rows)
    startup = sum(r.startup_s for r in rows)
    redone = sum(r.redone_s for r in rows)
    in_attempts = startup + productive + redone
    return GoodputLedger(
        ettr=round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
        wall_s=round(wall, 3),
        productive_s=round(productive, 3),
        lost_s=round(max(0.0, wall - productive), 3),
        startup_s=round(startup, 3),
        redone_s=round(redone, 3),
        restart_gaps_s=round(max(0.0, wall - in_attempts), 3),
        allocations=len(allocations),
        attempts=len(attempts),
        failures=sum(1 for a in attempts if a.failure is not None),
        restarts=tuple(restarts),
        reshapes=reshapes,
        growths=grown,
        growth_s=round(sum(g.cost_s for g in grown if g.cost_s is not None), 3),
        per_attempt=tuple(rows),
        updated=now,
    )


def pack_ledger(
    allocations: Sequence[Sequence[Allocation]],
    ledgers: Sequence[GoodputLedger | None],
    now: float | None = None,
    job_id: str | None = None,
) -> PackLedger:
    """The ledger of a pack (``cluster.pack``) from its members' own: each member's ``allocations`` (the same
    jobs, each as long as that member's supervisor held it) and ``ledgers`` (None for a member with no attempt
    yet). The pack's wall is the time its jobs were held (an allocation from its first member's start to its
    last one's end); its ETTR is the members' productive time over what the pack held for all of them (members
    x wall). ``job_id``: the pack's job, when the caller knows it."""
    now = time.time() if now is None else now
    spans: dict[tuple[str, int], tuple[float, float]] = {}
    for member in allocations:
        for a in member:
            start, end = spans.get(a.allocation, (a.start, _until(a.end, now)))
            spans[a.allocation] = (min(start, a.start), max(end, _until(a.end, now)))
    wall = sum(max(0.0, end - start) for start, end in spans.values())
    productive = sum(float(g.productive_s) if g is not None else 0.0 for g in ledgers)
    held = wall * len(ledgers)
    return PackLedger(
        members=len(ledgers),
        allocations=len(spans),
        wall_s=round(wall, 3),
        productive_s=round(productive, 3),
        ettr=round(min(1.0, productive / held), 4) if held > 0 else 0.0,
        job_id=job_id,
    )
