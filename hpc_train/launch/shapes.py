"""Which node count of a range finishes first: Slurm's start estimate for each, and the run's own step times.

A job that asks for a node range (``cluster.min_nodes`` below ``cluster.nodes``) can start on fewer nodes now or
on more nodes later. For each candidate count this asks Slurm when a job of that many nodes would start
(``sbatch --test-only``, which answers "to start at ..."), and estimates when it would finish: the start, the
run's start-up, and the steps left at the step time of that count. The step time comes from the best figure at
hand, and the table says which:

1. measured in this run dir: each attempt's steps and their times (``status/attempts.json``), per node count;
2. a scaling study (``cluster.slurm.scaling``: the ``scaling.json`` that ``python -m hpc_train.scaling``
   writes), its strong-scaling samples/s at the same number of ranks;
3. linear scaling from the nearest count measured either way (the global batch is the same at every count, so
   a step's work splits over the ranks: ideal, and said to be).

Where Slurm gives no estimate (no sbatch here) or nothing was measured, the table says so instead of guessing.
``cluster.slurm.shape=earliest_finish`` submits the count that finishes first; the range stays the default.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpc_train.config import Config
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import format_table, plural
from hpc_train.runtime.estimates import (
    candidate_counts,
    kept_step,
    measured_startup_s,
    measured_step_seconds,
    script_steps,
    slurm_start_estimate,
    step_time,
    steps_left,
    study_step_seconds,
)

__all__ = ["ShapeRow", "ShapeTable", "format_shape_table", "shape_table"]


@dataclass(frozen=True, kw_only=True)
class ShapeRow:
    """One node count of the range."""

    nodes: int
    start: float | None
    """When Slurm says a job of that many nodes would start (None: no estimate)."""
    start_note: str = ""
    """Why there is no start, or Slurm's refusal."""
    step_s: float | None = None
    step_source: str = ""
    finish: float | None = None


@dataclass(frozen=True, kw_only=True)
class ShapeTable:
    rows: tuple[ShapeRow, ...]
    steps_left: int | None
    """Steps from the run's latest checkpoint to its end (None: not known before its data set is built)."""
    startup_s: float | None
    """The run's measured start-up (None: none measured)."""
    asked_at: float

    @property
    def earliest(self) -> ShapeRow | None:
        """The count that finishes first (fewer nodes on a tie); None when no finish could be estimated."""
        done = [r for r in self.rows if r.finish is not None]
        return min(done, key=lambda r: (r.finish, r.nodes)) if done else None


def shape_table(cfg: Config, run_dir: RunDir, script: Path, now: float | None = None) -> ShapeTable:
    """Slurm's start and the estimated finish of each candidate count for the job of ``script``."""
    asked_at = time.time() if now is None else now
    attempts = run_dir.attempt_records()
    measured = measured_step_seconds(attempts)
    study = study_step_seconds(cfg)
    startup = measured_startup_s(attempts)
    left = steps_left(cfg, kept_step(attempts), script_steps(attempts))
    rows = []
    for nodes in candidate_counts(cfg):
        start, note = slurm_start_estimate(script, f"--nodes={nodes + cfg.cluster.slurm.spare_nodes}")
        step_s, source = step_time(nodes, measured, study)
        finish = None
        if start is not None and step_s is not None and left is not None:
            finish = max(start, asked_at) + (startup or 0.0) + left * step_s
        rows.append(
            ShapeRow(nodes=nodes, start=start, start_note=note, step_s=step_s, step_source=source, finish=finish)
        )
    return ShapeTable(rows=tuple(rows), steps_left=left, startup_s=startup, asked_at=asked_at)


# ---- the table ----------------------------------------------------------------------------------------------------


def _clock(when: float, now: float) -> str:
    stamp = datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M:%S")
    ahead = when - now
    if ahead < 60:
        return f"{stamp} (now)"
    return f"{stamp} (in {ahead / 60:.0f} min)"


def format_shape_table(table: ShapeTable, asked: str, choice: str = "range") -> str:
    """The table and what it means, as printed before a range job is submitted."""
    rows: list[Sequence[object]] = []
    for r in table.rows:
        start = _clock(r.start, table.asked_at) if r.start is not None else f"? ({r.start_note})"
        step = f"{r.step_s:.3g} s ({r.step_source})" if r.step_s is not None else "?"
        finish = _clock(r.finish, table.asked_at) if r.finish is not None else "?"
        rows.append((r.nodes, start, step, finish))
    if table.steps_left is None:
        left = "the steps left are not known before your data set is built (set trainer.max_steps)"
    else:
        left = f"{plural(table.steps_left, 'step')} left"
    startup = (
        f"start-up {table.startup_s:.0f} s (measured)" if table.startup_s is not None else "start-up not measured yet"
    )
    lines = [
        f"hpc_train: {asked}: when each node count would start (Slurm's sbatch --test-only) and finish "
        f"({left}; {startup}):",
        format_table(("nodes", "expected start", "step time", "expected finish"), rows),
    ]
    best = table.earliest
    if best is None:
        why = []
        if all(r.start is None for r in table.rows):
            why.append("Slurm gave no start time")
        if all(r.step_s is None for r in table.rows):
            why.append(
                "no step time is measured (none in this run dir, no cluster.slurm.scaling): after a first run, "
                "or with a scaling study, the finish times follow"
            )
        if table.steps_left is None:
            why.append("the steps left are not known")
        lines.append(f"hpc_train: no finish time estimated: {'; '.join(why) or 'no count has both figures'}.")
        if choice == "earliest_finish":
            lines.append("hpc_train: cluster.slurm.shape=earliest_finish: nothing to choose by; submitting the range.")
    elif choice == "earliest_finish":
        lines.append(
            f"hpc_train: cluster.slurm.shape=earliest_finish: submitting {plural(best.nodes, 'node')}, the first to finish."
        )
    else:
        lines.append(
            f"hpc_train: {plural(best.nodes, 'node')} would finish first; the job asks for the range and starts on "
            "what is free (cluster.slurm.shape=earliest_finish would submit that count instead)."
        )
    return "\n".join(lines)
