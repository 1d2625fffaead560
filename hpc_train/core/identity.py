"""Which job, allocation and attempt this process belongs to: read from the environment once, then passed down.

Slurm names a job by its id (``<array job>_<index>`` for an array element), and an allocation by the job id and
its restart count (``scontrol requeue`` keeps the id). hpc_train numbers the training steps it starts in a run
dir, across requeues and in-allocation restarts: the Slurm supervisor hands each step its number in
``HPC_TRAIN_ATTEMPT``, and a local launcher hands it to the worker as an argument.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = ["ATTEMPT_VARIABLE", "PACK_VARIABLE", "JobIdentity", "in_pack"]

ATTEMPT_VARIABLE = "HPC_TRAIN_ATTEMPT"
"""The attempt number the Slurm supervisor gives each training step (and a script's ranks inherit)."""
PACK_VARIABLE = "HPC_TRAIN_PACK"
"""``<member index>/<members>`` in the environment of a pack member's supervisor and of its ranks
(``cluster.pack``, ``hpc_train.runtime.pack``)."""


def in_pack(environ: Mapping[str, str] | None = None) -> bool:
    """This process is (or runs under) a member of a pack."""
    return bool((os.environ if environ is None else environ).get(PACK_VARIABLE))


def _count(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.strip().isdigit() else None


@dataclass(frozen=True, kw_only=True)
class JobIdentity:
    """This process's job and attempt, as the environment (and its launcher) told it when it started."""

    job_id: str | None = None
    """SLURM_JOB_ID (None outside Slurm)."""
    array_job_id: str | None = None
    array_task_id: str | None = None
    restart_count: int | None = None
    """SLURM_RESTART_COUNT: how often Slurm requeued the job (None when Slurm does not say)."""
    attempt: int = 0
    """Which attempt of the run dir this is: the supervisor's number for the training step (HPC_TRAIN_ATTEMPT,
    counting requeues and in-allocation restarts), else Slurm's restart count, else the number a local launcher
    handed the worker (``JobIdentity.next_attempt``). It names the rank logs."""
    supervised: bool = False
    """The attempt number came from the Slurm supervisor (HPC_TRAIN_ATTEMPT), not from Slurm's restart count or a
    local launcher."""

    @staticmethod
    def next_attempt(logged: int, recorded: Sequence[int] = ()) -> int:
        """The number of a run dir's next attempt, the one place it is worked out: one more than any attempt before
        it. ``logged``: the attempts that left their rank 0 log in the run dir (each names its log after its
        number: ``RunDir.logged_attempts``); ``recorded``: the numbers of the attempts the Slurm supervisor
        recorded (status/attempts.json), one per training step it ran."""
        return max(logged, len(recorded), max(recorded, default=-1) + 1)

    @staticmethod
    def ran_before(logged: int, this_one_logged: bool) -> bool:
        """Whether an attempt before this one ran in the run dir (``logged``: as ``next_attempt``;
        ``this_one_logged``: this attempt's rank 0 has written its own log already)."""
        return logged > (1 if this_one_logged else 0)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, launched: int = 0) -> JobIdentity:
        """Read once per process; ``launched`` is the attempt number a local launcher handed over."""
        environ = os.environ if environ is None else environ
        restart_count = _count(environ.get("SLURM_RESTART_COUNT"))
        supervisor = _count(environ.get(ATTEMPT_VARIABLE))
        counted = restart_count if restart_count is not None else launched
        return cls(
            job_id=environ.get("SLURM_JOB_ID") or None,
            array_job_id=environ.get("SLURM_ARRAY_JOB_ID") or None,
            array_task_id=environ.get("SLURM_ARRAY_TASK_ID") or None,
            restart_count=restart_count,
            attempt=counted if supervisor is None else supervisor,
            supervised=supervisor is not None,
        )

    @property
    def slurm_job(self) -> str | None:
        """What ``scontrol requeue`` and ``squeue`` take for this job: ``<array job>_<index>`` for an array
        element (so that only it is requeued), else the job id; None outside Slurm."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def requeues(self) -> int:
        """How often Slurm requeued this job so far (0 outside Slurm)."""
        return self.restart_count or 0

    @property
    def allocation(self) -> tuple[str, int]:
        """The allocation: the job and Slurm's restart count (``scontrol requeue`` keeps the job id)."""
        return self.slurm_job or "", self.requeues

    def for_attempt(self, number: int) -> JobIdentity:
        """The identity of the training step the supervisor starts as attempt ``number``."""
        return replace(self, attempt=number, supervised=True)

    def environ(self) -> dict[str, str]:
        """What a child process adds to its environment to build the same attempt number."""
        return {ATTEMPT_VARIABLE: str(self.attempt)}
