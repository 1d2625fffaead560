"""Grow when more frees up: a job that asked for a node range and trains on fewer than ``cluster.nodes`` comes back
larger when more nodes would start at once and the work left pays for the move.

Every ``cluster.slurm.grow_every_min`` minutes the supervisor asks Slurm whether a job of the missing nodes would
start now (``sbatch --test-only`` with the job's own script, its nodes excluded: Slurm weighs idle nodes and the
jobs pending ahead). For the largest count of the range that would, it estimates from the run's own figures:

- the gain: the steps left, each as much faster as the step times say (``runtime.estimates``: measured per node
  count, a scaling study, or linear from the nearest count);
- the cost: the stop's checkpoint (the run's measured stop-to-durable times), the requeue's gap (the run's own
  requeues, else Slurm's cred_expire + 1 s, which a requeued job waits before it may start) and a start-up (the
  run's measured ones).

Where a requeue sends the job back behind the jobs submitted before it (Slurm from 24.05.5 resets a requeued
job's submit time; 22.05 keeps it), a growth could hand the job's own nodes to a job already waiting: then it
grows only while no other job waits in its partition (``requeue_goes_behind``, ``pending_jobs``).

When the gain is larger it says so with the figures, records the decision (``status/growths.json``) and passes the
stop signal to the training step: the ranks checkpoint and rank 0 requeues the job, as after a preemption notice.
The requeued job asks for the range again, so it never waits for the larger count: it starts on what is free
then. The goodput ledger measures each growth's real cost (the decision to the first step on more nodes).
"""

from __future__ import annotations

import itertools
import re
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_train.config import Config
from hpc_train.core.goodput import step_seconds
from hpc_train.core.records import Allocation, AttemptRecord, Growth, Progress, RequeueEntry
from hpc_train.core.textutil import plural
from hpc_train.runtime.estimates import (
    candidate_counts,
    measured_startup_s,
    measured_step_seconds,
    script_steps,
    slurm_start_estimate,
    step_time,
    steps_left,
    study_step_seconds,
)
from hpc_train.runtime.timeouts import slurm_config

__all__ = [
    "AT_ONCE_S",
    "Estimate",
    "checkpoint_cost_s",
    "estimate",
    "job_submit_time",
    "larger_count",
    "pending_jobs",
    "requeue_gap_s",
    "requeue_goes_behind",
    "step_now",
]

AT_ONCE_S = 60.0
"""A start Slurm expects within this long counts as at once (its estimate has a resolution of seconds and the
scheduler runs every few)."""
REQUEUE_BEHIND_FROM = (24, 5, 5)
"""From this Slurm on a requeue resets the job's submit time (SchedMD's changelog: 24.05.5 and 24.11.0; seen on
the testbed's 24.11.5, where a requeued job waited behind a job submitted before the requeue), so among equal
priorities it queues again behind every job submitted before it. 22.05 keeps the submit time (the testbed)."""
QUERY_TIMEOUT_S = 15
SLURM_CRED_EXPIRE_S = 120
"""Slurm's default cred_expire: a requeued job may start only cred_expire + 1 s after it ended."""


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Growing from ``nodes_now`` to ``nodes_after``: what it would cost and gain, with where each figure comes from."""

    nodes_now: int
    nodes_after: int
    step: int = 0
    """Rank 0's step now, as far as the supervisor can tell (``step_now``)."""
    step_source: str = ""
    steps_left: int
    step_s_now: float
    step_s_after: float
    after_source: str
    checkpoint_s: float
    checkpoint_source: str
    gap_s: float
    gap_source: str
    startup_s: float
    startup_source: str

    @property
    def cost_s(self) -> float:
        return self.checkpoint_s + self.gap_s + self.startup_s

    @property
    def gain_s(self) -> float:
        return self.steps_left * (self.step_s_now - self.step_s_after)

    @property
    def worth(self) -> bool:
        return self.gain_s > self.cost_s

    def describe(self) -> str:
        verdict = "growing" if self.worth else "not worth it; staying"
        at = f" from step {self.step} ({self.step_source})" if self.step_source else ""
        return (
            f"{plural(self.nodes_after, 'node')} would start at once (on {self.nodes_now} now): {verdict}. Gain "
            f"{self.gain_s:.0f} s ({plural(self.steps_left, 'step')} left{at} at {self.step_s_now:.3g} s a step now, "
            f"{self.step_s_after:.3g} s on {self.nodes_after}: {self.after_source}); cost {self.cost_s:.0f} s "
            f"(checkpoint {self.checkpoint_s:.0f} s: {self.checkpoint_source}; requeue gap {self.gap_s:.0f} s: "
            f"{self.gap_source}; start-up {self.startup_s:.0f} s: {self.startup_source})"
        )

    def record(self, job_id: str, attempt: int, step: int | None, now: float) -> Growth:
        return Growth(
            time=now,
            job_id=job_id,
            attempt=attempt,
            step=step,
            nodes_before=self.nodes_now,
            nodes_expected=self.nodes_after,
            steps_left=self.steps_left,
            step_s_before=round(self.step_s_now, 6),
            step_s_after=round(self.step_s_after, 6),
            cost_s=round(self.cost_s, 3),
            gain_s=round(self.gain_s, 3),
        )


def larger_count(cfg: Config, script: Path, allocation: list[str], training: int) -> int | None:
    """The largest count of the range, above ``training``, whose missing nodes Slurm would start at once beside
    this job's ``allocation`` (None: no larger count would)."""
    user = cfg.cluster.slurm.exclude
    exclude = ",".join([*allocation, user] if user else allocation)
    for count in sorted(candidate_counts(cfg), reverse=True):
        if count <= training:
            return None
        missing = count + cfg.cluster.slurm.spare_nodes - len(allocation)
        if missing <= 0:  # (the allocation holds them already: not a count this job is short of)
            continue
        start, _ = slurm_start_estimate(script, f"--nodes={missing}", f"--exclude={exclude}")
        if start is not None and start <= time.time() + AT_ONCE_S:
            return count
    return None


def step_now(progress: Progress, step_s: float, now: float) -> tuple[int, str]:
    """Rank 0's step at ``now``, and where the figure comes from: its progress record's step, carried forward at
    ``step_s`` (the attempt's pace) for the time since the record was written. The record is refreshed with the
    node summaries (every cluster.status_every_s), and a decision on a step that old counted steps already done
    as still to gain from (a growth decided 650 steps behind rank 0, at 0.015 s a step, was not worth it)."""
    recorded = progress.step or 0
    age = now - progress.time if progress.time else 0.0
    if age <= 0 or step_s <= 0:
        return recorded, "rank 0's progress record, written just now"
    ahead = int(age / step_s)
    return recorded + ahead, (
        f"rank 0's progress record: step {recorded}, {age:.1f} s old, carried forward {plural(ahead, 'step')} at "
        f"{step_s:.3g} s a step"
    )


def estimate(
    cfg: Config,
    attempts: Sequence[AttemptRecord],
    progress: Progress,
    nodes: tuple[int, int],
    gap: tuple[float, str],
    checkpoint: tuple[float, str],
    now: float | None = None,
) -> Estimate | None:
    """The cost and gain of growing from ``nodes`` (now, after) at ``now``, for the run's ``attempts`` whose latest
    has made ``progress`` (rank 0's); ``gap`` and ``checkpoint``: the requeue's and the stop's cost, with where
    they come from (``requeue_gap_s``, ``checkpoint_cost_s``). None when a figure it needs is missing (fewer than
    two steps yet, the steps left unknown)."""
    nodes_now, nodes_after = nodes
    now_s = step_seconds(progress)
    if now_s is None:
        return None
    step, step_source = step_now(progress, now_s, time.time() if now is None else now)
    left = steps_left(cfg, step, progress.steps_total or script_steps(attempts))
    if left is None:
        return None
    measured = {**measured_step_seconds(attempts), nodes_now: now_s}  # this attempt's own pace, the freshest figure
    after_s, source = step_time(nodes_after, measured, study_step_seconds(cfg))
    if after_s is None:
        return None
    startup = measured_startup_s(attempts)
    return Estimate(
        nodes_now=nodes_now,
        nodes_after=nodes_after,
        step=step,
        step_source=step_source,
        steps_left=left,
        step_s_now=now_s,
        step_s_after=after_s,
        after_source=source,
        checkpoint_s=checkpoint[0],
        checkpoint_source=checkpoint[1],
        gap_s=gap[0],
        gap_source=gap[1],
        startup_s=startup or 0.0,
        startup_source="measured (median of this run's attempts)" if startup is not None else "not measured",
    )


def checkpoint_cost_s(stops: Sequence[RequeueEntry]) -> tuple[float, str]:
    """How long the stop's checkpoint takes: the median of the run's ``stops`` (signal to durable checkpoint)."""
    saved = [e.stop_saved_s for e in stops if e.stop_saved_s is not None]
    if not saved:
        return 0.0, "not measured yet"
    return float(statistics.median(saved)), f"median of {plural(len(saved), 'stop')}"


def requeue_gap_s(allocations: Sequence[Allocation]) -> tuple[float, str]:
    """The wait from a requeued job's end to its next start: measured on the run's own ``allocations``, else the
    delay Slurm imposes (cred_expire + 1 s, read from ``scontrol show config``)."""
    gaps = [
        after.start - before.end
        for before, after in itertools.pairwise(allocations)
        if before.job_id == after.job_id and before.end is not None and after.start >= before.end
    ]
    if gaps:
        return float(statistics.median(gaps)), f"median of this run's {plural(len(gaps), 'requeue')}"
    expire = _cred_expire_s()
    if expire is None:
        return SLURM_CRED_EXPIRE_S + 1.0, f"Slurm's default cred_expire ({SLURM_CRED_EXPIRE_S} s) + 1 s"
    return expire + 1.0, f"this cluster's cred_expire ({expire} s) + 1 s"


def _cred_expire_s() -> int | None:
    """AuthInfo's cred_expire from ``scontrol show config`` (None: not set there, or no answer)."""
    found = re.search(r"\bcred_expire=(\d+)", slurm_config("AuthInfo") or "")
    return int(found.group(1)) if found else None


def requeue_goes_behind(
    version: str | None, submitted: float | None, first_start: float | None, requeued: bool
) -> tuple[bool, str]:
    """Whether this job, requeued now, would queue behind the jobs submitted before the requeue, and why: as seen
    on the job itself once it has been requeued (its ``submitted`` time, from Slurm, later than its
    ``first_start``), else from the Slurm ``version`` (``REQUEUE_BEHIND_FROM``)."""
    if requeued and submitted is not None and first_start is not None:
        if submitted > first_start:
            return True, "seen on this job: its requeue moved its submit time to the requeue"
        return False, "seen on this job: its requeue kept its submit time"
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if found is None:
        return False, "the Slurm version is not known here"
    if tuple(int(g) for g in found.groups()) >= REQUEUE_BEHIND_FROM:
        return True, f"Slurm {version}: a requeue resets the job's submit time (from 24.05.5)"
    return False, f"Slurm {version}: a requeue keeps the job's submit time (before 24.05.5)"


def _query(argv: list[str]) -> str | None:
    """A Slurm command's stdout; None where it fails or does not answer in time."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def job_submit_time(job_id: str) -> float | None:
    """The job's SubmitTime (``scontrol show job``), as a time.time() value; None where Slurm does not say."""
    found = re.search(r"\bSubmitTime=(\S+)", _query(["scontrol", "show", "job", "-o", job_id]) or "")
    try:
        return time.mktime(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S")) if found else None
    except ValueError:  # ("Unknown", or a format of another Slurm)
        return None


def pending_jobs(partition: str, own: str) -> list[str] | None:
    """The other jobs waiting in ``partition`` (``squeue -t PD``); None where Slurm does not answer."""
    said = _query(["squeue", "-h", "-t", "PD", "-p", partition, "-o", "%A"])
    if said is None:
        return None
    return sorted({job for job in said.split() if job != own})
