"""Estimates from Slurm and from the run's own history: when a job of N nodes would start, how long a step takes
on N nodes, how many steps are left, and what a requeue costs. The shape table before a submission
(``launch.shapes``) and the supervisor's decision to grow (``runtime.grow``) read them.

Step times, best first: measured in the run dir (each attempt's steps and their times, per node count); a
scaling study's strong-scaling samples/s at the same number of ranks (``cluster.slurm.scaling``); linear scaling
from the nearest count either has (the global batch is the same at every count, so a step's work splits over
the ranks: ideal, and said to be).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from hpc_train.config import Config
from hpc_train.config.shape import Shape, fits_on
from hpc_train.core.errors import ConfigError
from hpc_train.core.goodput import step_seconds
from hpc_train.core.records import AttemptRecord, ScalingStudy

__all__ = [
    "MAX_CANDIDATES",
    "candidate_counts",
    "kept_step",
    "measured_startup_s",
    "measured_step_seconds",
    "script_steps",
    "slurm_start_estimate",
    "step_time",
    "steps_left",
    "study_step_seconds",
]

MAX_CANDIDATES = 8
"""Node counts asked about at most (one ``sbatch --test-only`` each): the fewest, the most, and counts spread
between them."""
TEST_ONLY_TIMEOUT_S = 30
_STARTS = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def candidate_counts(cfg: Config) -> list[int]:
    """The node counts of the range that the global batch splits over, at most MAX_CANDIDATES of them."""
    cluster = cfg.cluster
    counts = [n for n in range(cluster.fewest_nodes, cluster.nodes + 1) if fits_on(cfg, n)]
    if len(counts) <= MAX_CANDIDATES:
        return counts
    picks = {counts[round(i * (len(counts) - 1) / (MAX_CANDIDATES - 1))] for i in range(MAX_CANDIDATES)}
    return sorted(picks)


# ---- Slurm's answer -----------------------------------------------------------------------------------------------


def slurm_start_estimate(script: Path, *flags: str) -> tuple[float | None, str]:
    """When Slurm would start the job of ``script`` with ``flags`` on the command line (they win over its
    #SBATCH lines), by ``sbatch --test-only``: the time, or None and why not."""
    if shutil.which("sbatch") is None:
        return None, "no sbatch here: Slurm gives no estimate"
    try:
        proc = subprocess.run(
            ["sbatch", "--test-only", *flags, str(script)],
            capture_output=True,
            text=True,
            timeout=TEST_ONLY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"sbatch --test-only did not answer: {exc}"
    answer = f"{proc.stdout}\n{proc.stderr}"
    found = _STARTS.search(answer)
    words = " ".join(answer.split())[:160]
    if proc.returncode != 0:
        return None, f"Slurm refuses {' '.join(flags)}: {words}"
    if found is None:
        return None, f"no start time in {words!r}"
    return datetime.fromisoformat(found.group(1)).timestamp(), ""


# ---- the run's own figures ----------------------------------------------------------------------------------------


def measured_step_seconds(attempts: Sequence[AttemptRecord]) -> dict[int, float]:
    """Node count -> the step time of the latest attempt on that many nodes that made two steps or more."""
    out: dict[int, float] = {}
    for attempt in attempts:
        seconds = step_seconds(attempt.progress)
        if seconds and attempt.nodes:
            out[len(attempt.nodes)] = seconds
    return out


def measured_startup_s(attempts: Sequence[AttemptRecord]) -> float | None:
    """The median start-up (an attempt's start to its first step) of the run's attempts, when any made a step."""
    seconds = sorted(
        a.progress.first_time - a.start
        for a in attempts
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
        study = ScalingStudy.from_json(json.loads(Path(path).expanduser().read_text()))
    except (OSError, ValueError) as exc:  # (RecordError is a ValueError: it names the key and the value)
        raise ConfigError(
            f"cluster.slurm.scaling={path!r}: not a scaling study's table ({exc}). HINT: give the scaling.json that "
            "`python -m hpc_train.scaling --out DIR` wrote, or drop cluster.slurm.scaling"
        ) from None
    rates = {p.world_size: p.samples_per_s for p in study.points if p.mode == "strong" and p.samples_per_s > 0}
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


def kept_step(attempts: Sequence[AttemptRecord]) -> int:
    """The newest checkpoint the run's attempts kept (0: none): the trainer's, or the step a script's ranks agreed
    to stop at (it saves there)."""
    kept = [
        (p.step or 0) if p.stop_agreed else (p.checkpoint_step or 0)
        for p in (a.progress for a in attempts)
        if p is not None
    ]
    return max(kept, default=0)


def script_steps(attempts: Sequence[AttemptRecord]) -> int | None:
    """The steps a user's script trains in all, as its newest attempt told ``GlobalBatch.of`` (None: untold)."""
    told = [a.progress.steps_total for a in attempts if a.progress is not None and a.progress.steps_total]
    return told[-1] if told else None


def steps_left(cfg: Config, done: int, script_total: int | None = None) -> int | None:
    """Steps from step ``done`` to the run's end; None when the end is not known before the data set is built
    (a data set of the user's, and no trainer.max_steps), and for a user's script that did not say its
    ``script_total``."""
    if cfg.script.enabled:
        return None if script_total is None else max(0, script_total - done)
    tc = cfg.trainer
    total = tc.max_steps or math.inf
    if tc.epoch_limit:
        if cfg.data.dataset is not None:
            if not tc.max_steps:
                return None
        else:
            total = min(total, tc.epoch_limit * (cfg.data.num_train // Shape.of(cfg).global_batch))
    return max(0, int(total) - done)
