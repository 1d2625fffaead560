"""Requeue after preemption or the time-limit signal, with limits that count progress.

Runs on rank 0 once every rank has saved the same checkpoint. On Slurm the job asks to be put back in the
queue with ``scontrol requeue`` (``<array job>_<index>`` for an array element, so that only that element is
requeued); the restarted job finds the checkpoint in its run dir and goes on. Each stopped attempt is recorded
in ``status/restarts.json``; requeueing is refused, with the reason, after ``cluster.max_restarts`` restarts or
when the last attempts made no step of progress (``cluster.max_stalled_restarts``), so a job that cannot get
anywhere does not cycle through the queue forever.

``after_stop`` is the policy in one function: every rank calls it once training stopped on a signal.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hpc_train.config import ClusterConfig, Config
from hpc_train.core.errors import LaunchError
from hpc_train.core.records import RankState, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import at_step
from hpc_train.distributed import DistEnv
from hpc_train.runtime.outcome import Fit, Outcome
from hpc_train.train.stopping import signal_number

__all__ = ["after_stop", "record_attempt", "refusal", "requeue", "requeue_target"]

log = logging.getLogger("hpc_train")

SCONTROL_TIMEOUT_S = 30


def requeue_target(environ: Mapping[str, str] | None = None) -> str | None:
    """What ``scontrol requeue`` takes for this job (None outside a Slurm job)."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID") or None


def record_attempt(
    rd: RunDir, restart: int, resumed_step: int | None, stopped_step: int | None, signum: int
) -> list[RequeueEntry]:
    """Append this attempt to ``status/restarts.json``; returns the whole history."""
    entry = RequeueEntry(
        restart=restart, resumed_step=resumed_step, stopped_step=stopped_step, signal=signum, time=time.time()
    )
    return rd.append_restart(entry)


def refusal(history: Sequence[RequeueEntry], restart: int, cluster: ClusterConfig) -> str | None:
    """Why this job must not be requeued again (None: requeue it)."""
    if restart >= cluster.max_restarts:
        return (
            f"not requeued: the job was already restarted {restart} times (cluster.max_restarts="
            f"{cluster.max_restarts}). HINT: raise cluster.max_restarts, or resubmit: the run dir resumes from its "
            "last checkpoint"
        )
    stalled = 0
    for attempt in reversed(history):
        if attempt.progressed:  # progress made, or not known
            break
        stalled += 1
    if stalled > cluster.max_stalled_restarts:
        step = history[-1].stopped_step
        return (
            f"not requeued: the last {stalled} attempts stopped without a single new step (stuck at step {step}; "
            f"cluster.max_stalled_restarts={cluster.max_stalled_restarts}). HINT: the job is signalled before it "
            "reaches its first step: look at the start-up in the rank logs, or ask for a longer time limit"
        )
    return None


def requeue(target: str) -> None:
    """``scontrol requeue <target>``; LaunchError with scontrol's message when it fails."""
    try:
        proc = subprocess.run(
            ["scontrol", "requeue", target], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"scontrol requeue {target} failed: {exc}") from None
    if proc.returncode != 0:
        raise LaunchError(f"scontrol requeue {target} failed: {(proc.stderr or proc.stdout).strip()}")


def after_stop(rd: RunDir, env: DistEnv, cfg: Config, attempt: int, fit: Fit) -> Outcome:
    """Training stopped on a signal: every rank saved the checkpoint of ``fit.step`` (a user's script saved
    what it saves). On Slurm rank 0 requeues the job, within the limits.

    Only the preemption signal requeues: SIGTERM comes from Slurm ending the job (scancel, or a requeue or
    preemption that Slurm carries out itself) and SIGINT from a terminal; both just checkpoint and exit.
    """
    outcome = Outcome(state=RankState.STOPPED, step=fit.step or 0, signal=fit.signal, peak=fit.peak)
    own = fit.signal == signal_number(cfg.cluster.signal)
    # An allocation a shell holds (cluster.submit=here) is not a batch job: Slurm cannot requeue it.
    requeues = env.source == "slurm" and own and cfg.cluster.submit != "here"
    target = requeue_target() if requeues else None
    if target is None:
        log.warning("stopped %s on signal %d. Run again with the same run dir to resume", at_step(fit.step), fit.signal)
        return outcome
    if not env.is_main:
        return outcome
    history = record_attempt(rd, attempt, fit.start_step, fit.step, fit.signal)
    # Requeues count against cluster.max_restarts; restarts inside an allocation have their own limit.
    why_not = refusal(history, int(os.environ.get("SLURM_RESTART_COUNT") or 0), cfg.cluster)
    if why_not is not None:
        raise LaunchError(why_not)
    outcome = replace(outcome, requeued=target)
    # Written first: once requeued, Slurm ends this job's processes (SIGTERM, then SIGKILL) at any moment.
    rd.write_status(env.rank, outcome.state, step=outcome.step, restart=attempt, **outcome.extra)
    log.warning(
        "stopped %s on signal %d; requeueing %s (restart %d)", at_step(fit.step), fit.signal, target, attempt + 1
    )
    requeue(target)
    return outcome
