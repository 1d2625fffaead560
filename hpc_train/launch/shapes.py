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

import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from hpc_train.config import Config
from hpc_train.config.shape import Shape, fits_on
from hpc_train.core.errors import ConfigError
from hpc_train.core.goodput import step_seconds
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import format_table, plural
from hpc_train.launch.sbatch import JobSpec, render_sbatch

__all__ = [
    "ShapeRow",
    "ShapeTable",
    "candidate_counts",
    "format_shape_table",
    "measured_startup_s",
    "measured_step_seconds",
    "shape_table",
    "slurm_start",
    "step_time",
    "steps_left",
    "study_step_seconds",
]

MAX_CANDIDATES = 8
"""Node counts asked about at most (one ``sbatch --test-only`` each): the fewest, the most, and counts spread
between them."""
TEST_ONLY_TIMEOUT_S = 30
_STARTS = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


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


def candidate_counts(cfg: Config) -> list[int]:
    """The node counts of the range that the global batch splits over, at most MAX_CANDIDATES of them."""
    cluster = cfg.cluster
    counts = [n for n in range(cluster.fewest_nodes, cluster.nodes + 1) if fits_on(cfg, n)]
    if len(counts) <= MAX_CANDIDATES:
        return counts
    picks = {counts[round(i * (len(counts) - 1) / (MAX_CANDIDATES - 1))] for i in range(MAX_CANDIDATES)}
    return sorted(picks)


def shape_table(cfg: Config, run_dir: RunDir, spec: JobSpec, now: float | None = None) -> ShapeTable:
    """Slurm's start and the estimated finish of each candidate count for the job of ``spec``."""
    asked_at = time.time() if now is None else now
    measured = measured_step_seconds(run_dir)
    study = study_step_seconds(cfg)
    startup = measured_startup_s(run_dir)
    left = steps_left(cfg, run_dir)
    rows = []
    for nodes in candidate_counts(cfg):
        start, note = slurm_start(spec, nodes + cfg.cluster.slurm.spare_nodes)
        step_s, source = step_time(nodes, measured, study)
        finish = None
        if start is not None and step_s is not None and left is not None:
            finish = max(start, asked_at) + (startup or 0.0) + left * step_s
        rows.append(
            ShapeRow(nodes=nodes, start=start, start_note=note, step_s=step_s, step_source=source, finish=finish)
        )
    return ShapeTable(rows=tuple(rows), steps_left=left, startup_s=startup, asked_at=asked_at)


# ---- Slurm's answer -----------------------------------------------------------------------------------------------


def slurm_start(spec: JobSpec, nodes: int) -> tuple[float | None, str]:
    """When Slurm would start the job of ``spec`` on ``nodes`` nodes (``sbatch --test-only``); None and why not."""
    if shutil.which("sbatch") is None:
        return None, "no sbatch here: Slurm gives no estimate"
    one = replace(spec, flags={**spec.flags, "nodes": str(nodes)}, run_dirs=spec.run_dirs[:1], pack=1)
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", prefix="hpc_train_shape_") as script:
        script.write(render_sbatch(one))
        script.flush()
        try:
            proc = subprocess.run(
                ["sbatch", "--test-only", script.name],
                capture_output=True,
                text=True,
                timeout=TEST_ONLY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"sbatch --test-only did not answer: {exc}"
    answer = f"{proc.stdout}\n{proc.stderr}"
    found = _STARTS.search(answer)
    if proc.returncode != 0 or found is None:
        words = " ".join(answer.split())[:160]
        return None, f"Slurm refuses {plural(nodes, 'node')}: {words}" if proc.returncode else f"no start in {words!r}"
    return datetime.fromisoformat(found.group(1)).timestamp(), ""


# ---- the run's own figures ----------------------------------------------------------------------------------------


def measured_step_seconds(run_dir: RunDir) -> dict[int, float]:
    """Node count -> the step time of the latest attempt on that many nodes that made two steps or more."""
    out: dict[int, float] = {}
    for attempt in run_dir.attempt_records():
        seconds = step_seconds(attempt.progress)
        if seconds and attempt.nodes:
            out[len(attempt.nodes)] = seconds
    return out


def measured_startup_s(run_dir: RunDir) -> float | None:
    """The median start-up (an attempt's start to its first step) of the run's attempts, when any made a step."""
    seconds = sorted(
        a.progress.first_time - a.start
        for a in run_dir.attempt_records()
        if a.progress is not None and a.progress.first_time and a.start and a.progress.first_time > a.start
    )
    return seconds[len(seconds) // 2] if seconds else None


def study_step_seconds(cfg: Config) -> dict[int, float]:
    """Node count -> step time from ``cluster.slurm.scaling`` (a scaling study's strong-scaling samples/s at the
    same number of ranks, for this run's global batch); {} without one. ConfigError for a file that is not one."""
    path = cfg.cluster.slurm.scaling
    if not path:
        return {}
    try:
        points = json.loads(Path(path).expanduser().read_text())["points"]
        rates = {
            int(p["world_size"]): float(p["samples_per_s"])
            for p in points
            if p.get("mode", "strong") == "strong" and float(p["samples_per_s"]) > 0
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cluster.slurm.scaling={path!r}: not a scaling study's table ({exc}). HINT: give the scaling.json that "
            "`python -m hpc_train.scaling --out DIR` wrote, or drop cluster.slurm.scaling"
        ) from None
    per_node, batch = cfg.cluster.ranks_per_node, Shape.of(cfg).global_batch
    return {world // per_node: batch / rate for world, rate in rates.items() if world % per_node == 0}


def step_time(nodes: int, measured: dict[int, float], study: dict[int, float]) -> tuple[float | None, str]:
    """The step time at ``nodes`` and where it comes from: this run dir, the study, or linear scaling from the
    nearest count either has."""
    if nodes in measured:
        return measured[nodes], "measured"
    if nodes in study:
        return study[nodes], "scaling study"
    known = {**study, **measured}
    if not known:
        return None, ""
    base = min(known, key=lambda n: (abs(n - nodes), -n))
    origin = "measured" if base in measured else "study"
    return known[base] * base / nodes, f"linear from {base} ({origin})"


def steps_left(cfg: Config, run_dir: RunDir) -> int | None:
    """Steps from the run's newest kept step to its end; None when the end is not known before the data set is
    built (a data set of the user's, and no trainer.max_steps)."""
    tc = cfg.trainer
    total = tc.max_steps or math.inf
    if tc.epoch_limit:
        if cfg.data.dataset is not None:
            if not tc.max_steps:
                return None
        else:
            total = min(total, tc.epoch_limit * (cfg.data.num_train // Shape.of(cfg).global_batch))
    done = max(
        (a.progress.checkpoint_step or 0 for a in run_dir.attempt_records() if a.progress is not None), default=0
    )
    return max(0, int(total) - done)


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
