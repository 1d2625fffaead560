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

import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ledger"]


def _num(record: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _time(record: Mapping[str, Any], key: str, now: float) -> float:
    """A time stamp, ``now`` where it is missing (what is still running ends now)."""
    value = _num(record, key)
    return now if value is None else value


class _Progress:
    """One attempt's steps and their times, with the time of any step in between interpolated."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.first_step = _num(record, "first_step")
        self.first_time = _num(record, "first_time")
        if not self.first_time:  # 0: no step yet
            self.first_time = None
        self.step = _num(record, "step")
        self.time = _num(record, "time")
        self.checkpoint = (_num(record, "checkpoint_step"), _num(record, "checkpoint_time"))

    @property
    def stepped(self) -> bool:
        return None not in (self.first_step, self.first_time, self.step, self.time)

    @property
    def resumed(self) -> float | None:
        return None if self.first_step is None else self.first_step - 1

    @property
    def step_s(self) -> float:
        """The mean time of one step (0 when only one was made)."""
        if not self.stepped or self.step <= self.first_step:  # type: ignore[operator]
            return 0.0
        return (self.time - self.first_time) / (self.step - self.first_step)  # type: ignore[operator]

    @property
    def began(self) -> float:
        """When the first step began."""
        return self.first_time - self.step_s  # type: ignore[operator]

    def time_of(self, step: float) -> float:
        if self.checkpoint[0] == step and self.checkpoint[1] is not None:
            return self.checkpoint[1]
        if step >= self.step:  # type: ignore[operator]
            return self.time  # type: ignore[return-value]
        return self.first_time + (step - self.first_step) * self.step_s  # type: ignore[operator]


def _allocation(attempt: Mapping[str, Any]) -> tuple[Any, Any]:
    """Which allocation an attempt ran in: the job id and Slurm's restart count (a requeue keeps the id)."""
    return attempt.get("job_id"), attempt.get("requeue", 0)


def _kept(progress: _Progress, attempt: Mapping[str, Any], after: Mapping[str, Any] | None) -> float | None:
    """The step the run kept from this attempt."""
    if not progress.stepped:
        return None
    if after is not None:
        resumed = _Progress(after.get("progress") or {}).resumed
        if resumed is not None:
            return min(resumed, progress.step)  # type: ignore[type-var]
    if attempt.get("end") is None or attempt.get("outcome") in ("completed", "stopped"):
        return progress.step
    return progress.checkpoint[0] if progress.checkpoint[0] is not None else progress.resumed


def ledger(
    allocations: Sequence[Mapping[str, Any]], attempts: Sequence[Mapping[str, Any]], now: float | None = None
) -> dict[str, Any]:
    """The ledger of a run (what ``status/goodput.json`` holds)."""
    now = time.time() if now is None else now
    wall = sum(max(0.0, _time(a, "end", now) - _time(a, "start", now)) for a in allocations)
    rows: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    for i, attempt in enumerate(attempts):
        after = attempts[i + 1] if i + 1 < len(attempts) else None
        progress = _Progress(attempt.get("progress") or {})
        start, end = _time(attempt, "start", now), _time(attempt, "end", now)
        kept = _kept(progress, attempt, after)
        if progress.stepped:
            startup = min(max(0.0, progress.began - start), end - start)
            productive = 0.0
            if kept is not None and kept > progress.resumed:  # type: ignore[operator]
                productive = min(max(0.0, progress.time_of(kept) - progress.began), end - start - startup)
        else:
            startup, productive = end - start, 0.0
        failure = attempt.get("failure") or {}
        rows.append(
            {
                "attempt": attempt.get("attempt"),
                "job_id": attempt.get("job_id"),
                "outcome": attempt.get("outcome"),
                "class": failure.get("kind"),
                "nodes": attempt.get("nodes"),
                "resumed_step": progress.resumed,
                "last_step": progress.step,
                "kept_step": kept,
                "startup_s": round(startup, 3),
                "productive_s": round(productive, 3),
                "redone_s": round(max(0.0, end - start - startup - productive), 3),
            }
        )
        after_progress = _Progress(after.get("progress") or {}) if after is not None else None
        if failure and after_progress is not None and after_progress.stepped:
            failed_at = progress.time if progress.stepped else start
            restarts.append(
                {
                    "after_attempt": attempt.get("attempt"),
                    "class": failure.get("kind"),
                    "in_allocation": _allocation(after) == _allocation(attempt),  # type: ignore[arg-type]
                    "latency_s": round(after_progress.first_time - failed_at, 3),  # type: ignore[operator]
                }
            )
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
        "failures": sum(1 for a in attempts if a.get("failure")),
        "restarts": restarts,
        "per_attempt": rows,
        "updated": now,
    }
