"""Requeue after preemption or the time-limit signal, within the run's retry budget.

Runs on rank 0 once every rank has saved the same checkpoint. On Slurm the job asks to be put back in the
queue with ``scontrol requeue`` (``<array job>_<index>`` for an array element, so that only that element is
requeued: ``JobIdentity.slurm_job``); the restarted job finds the checkpoint in its run dir and goes on. Each
stopped attempt is recorded in ``status/restarts.json``; requeueing is refused, with the reason, once the
requeue budget is spent (``runtime.retry``: ``cluster.slurm.max_restarts`` requeues, ``cluster.slurm.max_stalled_restarts``
attempts in a row without progress), so a job that cannot get anywhere does not cycle through the queue forever.

``after_stop`` is the policy in one function: every rank calls it once training stopped on a signal.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hpc_train.config import ClusterConfig, Config
from hpc_train.core.errors import LaunchError
from hpc_train.core.identity import JobIdentity, in_pack
from hpc_train.core.records import RankState, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import at_step
from hpc_train.distributed import DistEnv
from hpc_train.runtime.outcome import Fit, Outcome
from hpc_train.runtime.retry import RetryBudget, requeue_progressed
from hpc_train.train.stopping import signal_number

__all__ = ["after_stop", "record_attempt", "refusal", "requeue", "requeue_target"]

log = logging.getLogger("hpc_train")

SCONTROL_TIMEOUT_S = 30


def requeue_target(environ: Mapping[str, str] | None = None) -> str | None:
    """What ``scontrol requeue`` takes for this job (None outside a Slurm job)."""
    return JobIdentity.from_environ(environ).slurm_job


def record_attempt(
    rd: RunDir,
    attempt: int,
    resumed_step: int | None,
    stopped_step: int | None,
    signum: int,
    stop_saved_s: float | None = None,
) -> list[RequeueEntry]:
    """Append this attempt to ``status/restarts.json``; returns the whole history."""
    entry = RequeueEntry(
        attempt=attempt,
        resumed_step=resumed_step,
        stopped_step=stopped_step,
        signal=signum,
        time=time.time(),
        stop_saved_s=None if stop_saved_s is None else round(stop_saved_s, 3),
    )
    return rd.append_restart(entry)


def refusal(history: Sequence[RequeueEntry], restart: int, cluster: ClusterConfig) -> str | None:
    """Why this job must not be requeued again, after ``restart`` requeues (None: requeue it)."""
    spent = RetryBudget.requeues(cluster).spent(restart, [requeue_progressed(entry) for entry in history])
    if spent is None:
        return None
    if not spent.stalled:
        return (
            f"not requeued: the job was already restarted {restart} times (cluster.slurm.max_restarts="
            f"{cluster.slurm.max_restarts}). HINT: raise cluster.slurm.max_restarts, or resubmit: the run dir resumes from its "
            "last checkpoint"
        )
    step = history[-1].stopped_step
    return (
        f"not requeued: the last {spent.count} attempts stopped without a single new step (stuck at step {step}; "
        f"cluster.slurm.max_stalled_restarts={cluster.slurm.max_stalled_restarts}). HINT: the job is signalled before it "
        "reaches its first step: look at the start-up in the rank logs, or ask for a longer time limit"
    )


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


def after_stop(rd: RunDir, env: DistEnv, cfg: Config, job: JobIdentity, fit: Fit) -> Outcome:
    """Training stopped on a signal: every rank saved the checkpoint of ``fit.step`` (a user's script saved
    what it saves). On Slurm rank 0 requeues the job, within the limits.

    Only the preemption signal requeues: SIGTERM comes from Slurm ending the job (scancel, or a requeue or
    preemption that Slurm carries out itself) and SIGINT from a terminal; both just checkpoint and exit.
    """
    outcome = Outcome(
        state=RankState.STOPPED, step=fit.step or 0, signal=fit.signal, peak=fit.peak, stop_saved_s=fit.stop_saved_s
    )
    own = fit.signal == signal_number(cfg.cluster.signal)
    # An allocation a shell holds (cluster.slurm.submit=here) is not a batch job: Slurm cannot requeue it.
    requeues = env.source == "slurm" and own and cfg.cluster.slurm.submit != "here"
    target = job.slurm_job if requeues else None
    if target is None:
        log.warning("stopped %s on signal %d. Run again with the same run dir to resume", at_step(fit.step), fit.signal)
        return outcome
    if not env.is_main:
        return outcome
    if in_pack() and rd.cancel_requested():  # the stop was `jobs cancel` of this member alone
        log.warning("stopped %s: this member of the pack was cancelled alone; not requeued", at_step(fit.step))
        return outcome
    leaving = rd.restart_requested()
    if leaving is not None:  # the supervisor goes on in this allocation without a node (a straggler's)
        log.warning(
            "stopped %s for the supervisor, which goes on in this allocation without %s (%s); not requeued",
            at_step(fit.step),
            leaving.host,
            leaving.why,
        )
        return outcome
    history = record_attempt(rd, job.attempt, fit.start_step, fit.step, fit.signal, fit.stop_saved_s)
    # Requeues spend the requeue budget; restarts inside an allocation spend their own (runtime.retry).
    why_not = refusal(history, job.requeues, cfg.cluster)
    if why_not is not None:
        raise LaunchError(why_not)
    outcome = replace(outcome, requeued=target)
    # Written first: once requeued, Slurm ends this job's processes (SIGTERM, then SIGKILL) at any moment.
    rd.write_status(env.rank, outcome.state, attempt=job.attempt, step=outcome.step, **outcome.extra)
    if in_pack():  # the pack's supervisor requeues the job once, when every member has stopped or finished
        log.warning("stopped %s on signal %d; the pack's supervisor requeues %s", at_step(fit.step), fit.signal, target)
        return outcome
    log.warning(
        "stopped %s on signal %d; requeueing %s (restart %d)", at_step(fit.step), fit.signal, target, job.attempt + 1
    )
    requeue(target)
    return outcome
