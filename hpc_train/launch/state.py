"""The state of a run, reconciled from squeue, sacct (when it works) and the files the ranks write.

sacct alone is not enough: clusters without accounting exist, slurmdbd can be down, and a rank killed with
SIGKILL never writes a result. So the ranks' own status files come first (a rank that completed or failed says
so), the scheduler's view next, and a job the scheduler no longer knows is judged from what is on disk.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hpc_train.core import owner
from hpc_train.core.errors import ExitCode
from hpc_train.core.records import (
    Allocation,
    AttemptOutcome,
    AttemptRecord,
    Growth,
    RankStatus,
    RequeueEntry,
    Reshape,
)
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import (
    RankFailure,
    RankState,
    all_ranks,
    completion_notes,
    is_live,
    never_started,
    rank_failures,
    rank_process_alive,
)
from hpc_train.core.textutil import at_step, number_ranges

__all__ = [
    "ACTIVE_STATES",
    "UNREACHABLE",
    "JobState",
    "attempts_note",
    "checked_attempts",
    "checked_statuses",
    "job_state",
    "resume_command",
    "sacct_state",
    "squeue_state",
]

# Slurm states of a job that has not ended yet.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "STAGE_OUT",
        "SIGNALING",
        "STOPPED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
COMMAND_TIMEOUT_S = 20
UNREACHABLE = "UNREACHABLE"
"""squeue_state's answer when squeue exists but did not answer (slurmctld down or busy): not "job gone"."""


@dataclass
class JobState:
    """One run's state and why we believe it."""

    state: str
    """A Slurm state name (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) or ENDED/UNKNOWN; for a
    local run COMPLETED, FAILED, STOPPED (on a signal, resumable), RUNNING (its processes checked) or RUNNING? (on
    another host)."""
    done: bool
    ok: bool
    job_id: str = ""
    detail: str = ""
    squeue: str | None = None
    sacct: str | None = None
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    attempts: list[AttemptRecord] = field(default_factory=list)
    """The supervisor's attempts (``checked_attempts``: less what is damaged)."""
    damaged: list[str] = field(default_factory=list)
    """A line for each damaged record in status/ (left out of the verdict): the file and what is wrong."""


# ---- the records, checked ----------------------------------------------------------------------------------


def checked_statuses(run_dir: RunDir) -> tuple[dict[int, RankStatus], list[str]]:
    """Each rank's latest status, less what is damaged, with a line for each damaged record
    (``RunDir.checked_statuses``)."""
    return run_dir.checked_statuses()


def checked_attempts(run_dir: RunDir) -> tuple[list[AttemptRecord], list[str]]:
    """The supervisor's attempts, less what is damaged, with a line for each damaged record
    (``RunDir.checked_attempts``)."""
    return run_dir.checked_attempts()


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | str | None:
    """The finished command; None when it is not installed; UNREACHABLE when it did not answer in time."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return UNREACHABLE


def squeue_state(job_id: str) -> str | None:
    """The job's state per squeue; None when Slurm no longer lists it (or there is no squeue), UNREACHABLE
    when squeue could not ask slurmctld."""
    proc = _run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"])
    if not isinstance(proc, subprocess.CompletedProcess):
        return proc
    if proc.returncode != 0:
        return None if "Invalid job id" in proc.stderr else UNREACHABLE
    states = proc.stdout.split()
    return states[0] if states else None


def sacct_state(job_id: str) -> str | None:
    """The job's state from accounting, None where sacct is missing, disabled or cannot reach slurmdbd."""
    proc = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State"])
    if not isinstance(proc, subprocess.CompletedProcess) or proc.returncode != 0:
        return None
    states = proc.stdout.split("\n")[0].split()  # "CANCELLED by 0" -> CANCELLED
    return states[0] if states else None


def _reported_failures(statuses: dict[int, RankStatus]) -> list[str]:
    """The failures the ranks wrote, while the job may still run (a live rank may yet report)."""
    return [str(f) for f in rank_failures(statuses, gone=lambda status: False)]


def _reasons(statuses: dict[int, RankStatus], world_size: int) -> list[str]:
    """Why an ended job did not complete: ranks still marked live when it ended (killed, or never got to
    report), ranks that never started, and the failures the others reported."""
    missing = never_started(statuses, world_size)
    never = [f"rank {missing[0]} never started"] if len(missing) == 1 else []
    if len(missing) > 1:
        never = [f"ranks {number_ranges(missing)} never started ({len(missing)} ranks)"]
    failures = rank_failures(statuses, gone=lambda status: True)  # the job has ended: no rank is live
    silent = _first_few_failures([f for f in failures if not f.reported], "ended without a word")
    return silent + never + _first_few_failures([f for f in failures if f.reported], "failed")


def _first_few_failures(failures: list[RankFailure], verb: str, shown: int = 5) -> list[str]:
    """The first few failures, and a count of the rest with their ranks: a few lines at any scale."""
    rest = failures[shown:]
    more = [f"{len(rest)} more ranks {verb}: {number_ranges(f.rank for f in rest)}"] if rest else []
    return [str(f) for f in failures[:shown]] + more


def attempts_note(attempts: list[AttemptRecord]) -> str:
    """What the supervisor says about the attempts (``RunDir.attempt_records``): the attempt running, the
    failures retried, and a fatal failure or the limit that ended the job (empty for a run without a supervisor)."""
    if not attempts:
        return ""
    last = attempts[-1]
    described = last.failure.describe() if last.failure is not None else "?"
    if last.outcome is AttemptOutcome.FATAL:
        return f"attempt {last.attempt}: fatal failure, not retried or requeued (exit {ExitCode.FATAL}): {described}"
    if last.outcome is AttemptOutcome.GAVE_UP:
        why = last.message or "?"
        return f"attempt {last.attempt}: gave up (exit {ExitCode.GAVE_UP}): {why}; last failure: {described}"
    failures = [a.failure for a in attempts if a.failure is not None]
    retried = ""
    if failures:
        retried = f" after {len(failures)} failure(s) retried in the allocation (last: {failures[-1].describe()})"
    return f"attempt {last.attempt} {last.outcome.value}{retried}"


def job_state(run_dir: RunDir, world_size: int) -> JobState:
    """Reconcile every source into one state for the run in ``run_dir``."""
    job = run_dir.job()
    job_id = job.job_id if job is not None else ""
    packed = job is not None and job.pack is not None
    statuses, damaged = checked_statuses(run_dir)
    attempts, damaged_attempts = checked_attempts(run_dir)
    if attempts and attempts[-1].ranks and attempts[-1].job_id == job_id:
        world_size = attempts[-1].ranks  # the job went on with fewer nodes (cluster.min_nodes)
    squeue = squeue_state(job_id) if job_id else None
    # Accounting is asked only when squeue has no live answer: followers poll this every second.
    sacct = sacct_state(job_id) if job_id and squeue not in ACTIVE_STATES else None
    base = JobState(
        "UNKNOWN",
        done=False,
        ok=False,
        job_id=job_id,
        squeue=squeue,
        sacct=sacct,
        ranks=statuses,
        attempts=attempts,
        damaged=damaged + damaged_attempts,
    )

    def verdict(state: str, done: bool, ok: bool = False, detail: str = "") -> JobState:
        return replace(base, state=state, done=done, ok=ok, detail=detail)

    notes = [attempts_note(attempts)] if attempts else []
    notes += stops_note(run_dir.requeue_records()) + reshapes_note(run_dir.reshape_records())
    shape = asked_note(run_dir.allocation_records(), job_id) + growths_note(run_dir.growth_records())
    notes += shape
    if all_ranks(statuses, world_size, RankState.COMPLETED):
        retried = notes if len(attempts) > 1 else shape  # what the job got is said even after one attempt
        doubts = [f"warning: {note}" for note in completion_notes(statuses)]  # no sign of training
        detail = "; ".join(["every rank completed", *retried, *doubts])
        return verdict("COMPLETED", done=True, ok=True, detail=detail)
    failures = _reported_failures(statuses)
    if packed and run_dir.cancel_requested():  # `jobs cancel` of this member alone
        live = any(is_live(s) for s in statuses.values())
        detail = "; ".join([f"cancelled alone (jobs cancel); the pack's other members go on in job {job_id}", *notes])
        return verdict("CANCELLING" if live else "CANCELLED", done=not live, detail=detail)
    ended = attempts[-1].outcome in (AttemptOutcome.FATAL, AttemptOutcome.GAVE_UP) if attempts else False
    if ended and packed and squeue in ACTIVE_STATES:  # its job runs on for the pack's other members
        return verdict("FAILED", done=True, detail="; ".join([*notes, *failures]))
    if squeue in ACTIVE_STATES:
        return verdict(squeue, done=False, ok=False, detail="; ".join([*notes, *failures]))
    if squeue == UNREACHABLE and sacct is None:
        detail = "; ".join(["squeue could not reach slurmctld and sacct gave nothing", *failures])
        return verdict("UNKNOWN", done=False, detail=detail)
    scheduler = sacct if squeue in (None, UNREACHABLE) else squeue
    batch = run_dir.batch_exit_record()
    reasons = [*notes, *_reasons(statuses, world_size)]
    if batch is not None:
        reasons.append(f"the job script exited with status {batch.exit_code}")
    if scheduler is not None:
        if scheduler == "COMPLETED":  # the scheduler saw a clean exit, but not every rank finished its work
            return verdict("FAILED", done=True, ok=False, detail="; ".join(["Slurm says COMPLETED", *reasons]))
        return verdict(scheduler, done=True, ok=False, detail="; ".join(reasons))
    if not job_id:
        return _without_scheduler(run_dir, statuses, world_size, verdict)
    # Not in squeue, no accounting: the job has ended (or its id is wrong).
    if not statuses and batch is None:
        return verdict("ENDED", done=True, detail="Slurm no longer lists the job and no rank ever started")
    return verdict("FAILED", done=True, detail="; ".join(reasons) or "ended before every rank completed")


def stops_note(history: list[RequeueEntry]) -> list[str]:
    """How soon each stop's checkpoint was durable after its signal, for the requeues that say."""
    seconds = [f"{entry.stop_saved_s:.1f}" for entry in history if entry.stop_saved_s is not None]
    if not seconds:
        return []
    return [f"requeued {len(history)}x; checkpoint durable {', '.join(seconds)} s after each stop signal"]


def asked_note(allocations: list[Allocation], job_id: str) -> list[str]:
    """'job 12 asked for 2-8 nodes, got 4' for the job's latest allocation, when it asked for a node range."""
    last = allocations[-1] if allocations else None
    if last is None or not last.asked or (job_id and last.job_id != job_id):  # (a job submitted since: not yet)
        return []
    return [f"job {last.job_id} {last.asked}"]


def growths_note(growths: list[Growth]) -> list[str]:
    """The last stop to come back on more nodes (cluster.slurm.grow_every_min), with how many there were."""
    if not growths:
        return []
    last = growths[-1]
    times = f" (the last of {len(growths)})" if len(growths) > 1 else ""
    return [
        f"stopped to grow from {last.nodes_before} to {last.nodes_expected} nodes at step {last.step}{times}: "
        f"estimated gain {last.gain_s or 0:.0f} s, cost {last.cost_s or 0:.0f} s"
    ]


def reshapes_note(history: list[Reshape]) -> list[str]:
    """The last change of shape, with how many there were: 'resumed on 1 node x 2 tasks (...), trained before
    on 2 nodes x 2 tasks (...)'."""
    if not history:
        return []
    times = f" (the last of {len(history)} changes of shape)" if len(history) > 1 else ""
    last = history[-1]
    if last.why:  # the supervisor went on with fewer nodes
        return [f"went on with {last.onto}, trained before on {last.was}: {last.why}{times}"]
    return [f"resumed on {last.onto}, trained before on {last.was}{times}"]


def resume_command(run_dir: RunDir) -> str:
    """The command that resumes a local run in its own run dir from its latest checkpoint."""
    words = [f"hydra.run.dir={run_dir.path}", *run_dir.read_overrides()]
    return " ".join(["python -m hpc_train", *(shlex.quote(w) for w in words)])


def _without_scheduler(
    run_dir: RunDir, statuses: dict[int, RankStatus], world_size: int, verdict: Callable[..., JobState]
) -> JobState:
    """A run with no scheduler job (cluster=local or debug): the ranks' files, and whether the processes that
    wrote them still run (a rank killed, or whose terminal was closed, never writes its end)."""
    interrupted = run_dir.interruption()
    alive = {rank: rank_process_alive(s) for rank, s in statuses.items() if is_live(s)}
    starting = all(s.state is RankState.STARTING for s in statuses.values())
    if interrupted is not None and starting and not any(up is not False for up in alive.values()):
        who = f"local job {interrupted.job_id}" if interrupted.job_id else "the launch"
        when = time.strftime("%H:%M:%S", time.localtime(interrupted.time))
        detail = (
            f"stopped during start-up ({who} ended on Ctrl-C at {when}): nothing trained; start it again: "
            f"{resume_command(run_dir)}"
        )
        return verdict("STOPPED", done=True, detail=detail)
    if not statuses and owner.current_owner(run_dir.path) is not None:
        return verdict("STARTING", done=False, detail="its launcher runs; no rank has written a status yet")
    if not statuses:  # (a launcher about to claim it, or one that ended without a word)
        return verdict("UNKNOWN", done=False, detail="no job id and no rank status in this run dir")
    running = sorted(rank for rank, up in alive.items() if up is not False)
    failures = rank_failures(statuses, gone=lambda status: rank_process_alive(status) is False)
    if failures:
        return verdict("FAILED", done=not running, detail=_local_failure(run_dir, failures, running))
    if any(up is None for up in alive.values()):
        host = next(str(statuses[rank].host) for rank, up in alive.items() if up is None)
        return verdict("RUNNING?", done=False, detail=f"local run on {host}: its processes cannot be checked here")
    if running:
        pids = ", ".join(str(statuses[rank].pid) for rank in running)
        return verdict("RUNNING", done=False, detail=f"local run; the ranks' processes run (pid {pids})")
    missing = never_started(statuses, world_size)
    if missing:
        return verdict("FAILED", done=True, detail=f"ranks {missing} never started")
    if {s.state for s in statuses.values()} <= {RankState.STOPPED, RankState.COMPLETED}:
        steps = [s.step for s in statuses.values() if s.step is not None]
        saved = statuses[0].stop_saved_s if 0 in statuses else None
        durable = f" (checkpoint durable {saved:.1f} s after the signal)" if saved is not None else ""
        detail = "; ".join(
            [
                f"stopped {at_step(max(steps) if steps else None)} on a signal{durable}",
                *reshapes_note(run_dir.reshape_records()),
                f"resume: {resume_command(run_dir)}",
            ]
        )
        return verdict("STOPPED", done=True, detail=detail)
    return verdict("UNKNOWN", done=False, detail="the ranks' statuses name no known state")


def _local_failure(run_dir: RunDir, failures: list[RankFailure], running: list[int]) -> str:
    """Which ranks failed or died, and what to do: cancel the ranks left, or resume from the last checkpoint."""
    notes = _first_few_failures(failures, "failed or ended without a word")
    if any(not f.reported for f in failures):
        notes.append("a local rank that ends without a word was killed (SIGKILL, out of memory, its terminal closed)")
    checkpoints = run_dir.checkpoint_files()
    if running:
        notes.append(f"ranks {running} still run; end them with: python -m hpc_train.jobs cancel {run_dir.path}")
    elif checkpoints:
        notes.append(f"resume from {checkpoints[-1].name}: {resume_command(run_dir)}")
    return "; ".join(notes)
