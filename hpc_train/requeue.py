"""Requeue after preemption or the time-limit signal, with limits that count progress.

Runs on rank 0 once every rank has saved the same checkpoint. On Slurm the job asks to be put back in the
queue with ``scontrol requeue`` (``<array job>_<index>`` for an array element, so that only that element is
requeued); the restarted job finds the checkpoint in its run dir and goes on. Each stopped attempt is recorded
in ``status/restarts.json``; requeueing is refused, with the reason, after ``cluster.max_restarts`` restarts or
when the last attempts made no step of progress (``cluster.max_stalled_restarts``), so a job that cannot get
anywhere does not cycle through the queue forever.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from hpc_train.config import ClusterConfig
from hpc_train.core.rundir import RunDir

__all__ = ["record_attempt", "refusal", "requeue", "requeue_target"]

SCONTROL_TIMEOUT_S = 30


def requeue_target(environ: Mapping[str, str] | None = None) -> str | None:
    """What ``scontrol requeue`` takes for this job (None outside a Slurm job)."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID") or None


def record_attempt(rd: RunDir, restart: int, resumed_step: int, stopped_step: int, signum: int) -> list[dict[str, Any]]:
    """Append this attempt to ``status/restarts.json``; returns the whole history."""
    entry = {
        "restart": restart,
        "resumed_step": resumed_step,
        "stopped_step": stopped_step,
        "signal": signum,
        "time": time.time(),
    }
    return rd.append_restart(entry)


def refusal(history: list[dict[str, Any]], restart: int, cluster: ClusterConfig) -> str | None:
    """Why this job must not be requeued again (None: requeue it)."""
    if restart >= cluster.max_restarts:
        return (
            f"not requeued: the job was already restarted {restart} times (cluster.max_restarts="
            f"{cluster.max_restarts}). HINT: raise cluster.max_restarts, or resubmit: the run dir resumes from its "
            "last checkpoint"
        )
    stalled = 0
    for attempt in reversed(history):
        if attempt["stopped_step"] > attempt["resumed_step"]:
            break
        stalled += 1
    if stalled > cluster.max_stalled_restarts:
        step = history[-1]["stopped_step"]
        return (
            f"not requeued: the last {stalled} attempts stopped without a single new step (stuck at step {step}; "
            f"cluster.max_stalled_restarts={cluster.max_stalled_restarts}). HINT: the job is signalled before it "
            "reaches its first step: look at the start-up in the rank logs, or ask for a longer time limit"
        )
    return None


def requeue(target: str) -> None:
    """``scontrol requeue <target>``; RuntimeError with scontrol's message when it fails."""
    try:
        proc = subprocess.run(
            ["scontrol", "requeue", target], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"scontrol requeue {target} failed: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol requeue {target} failed: {(proc.stderr or proc.stdout).strip()}")
