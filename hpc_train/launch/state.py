"""The state of a run, reconciled from squeue, sacct (when it works) and the files the ranks write.

sacct alone is not enough: clusters without accounting exist, slurmdbd can be down, and a rank killed with
SIGKILL never writes a result. So the ranks' own status files come first (a rank that completed or failed says
so), the scheduler's view next, and a job the scheduler no longer knows is judged from what is on disk.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc_train.core.errors import EXIT_FATAL, EXIT_GAVE_UP
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import (
    RankFailure,
    RankState,
    all_ranks,
    check_status,
    is_live,
    never_started,
    rank_failures,
    rank_process_alive,
)
from hpc_train.core.textutil import at_step

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
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """The supervisor's attempts (``checked_attempts``: less what is damaged)."""
    damaged: list[str] = field(default_factory=list)
    """A line for each damaged record in status/ (left out of the verdict): the file and what is wrong."""


# ---- the records, checked ----------------------------------------------------------------------------------


def _load(path: Path) -> tuple[Any, str | None]:
    """The JSON value in ``path`` (None when the file does not exist), or why it cannot be read."""
    try:
        return json.loads(path.read_bytes()), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # a JSON error, or bytes that are no UTF-8
        return None, f"{path}: not valid JSON, truncated or overwritten? ({str(exc)[:120]}): ignored"


def checked_statuses(run_dir: RunDir) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Each rank's latest status (what ``RunDir.read_statuses`` reads), less what is damaged, with a line for
    each damaged record: a file that is no JSON object, names no rank, or holds a value of the wrong type
    (``core.state.check_status``)."""
    statuses: dict[int, dict[str, Any]] = {}
    damaged: list[str] = []
    for path in sorted(run_dir.status_dir.glob("rank_*.json")):  # the files RunDir.status_path names
        record, unreadable = _load(path)
        if unreadable:
            damaged.append(unreadable)
            continue
        clean, problems = check_status(record)
        damaged += [f"{path}: {problem}" for problem in problems]
        if clean is not None:
            if path.name != run_dir.status_path(clean["rank"]).name:
                damaged.append(f"{path}: says rank {clean['rank']}, which is not the rank its name says")
            statuses[clean["rank"]] = clean
    return statuses, damaged


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_ATTEMPT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "attempt": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an attempt number"),
    "outcome": (lambda v: isinstance(v, str), "an outcome (running, completed, stopped, failed, ...)"),
    "failure": (lambda v: v is None or isinstance(v, dict), "a JSON object"),
    "progress": (lambda v: v is None or isinstance(v, dict), "a JSON object"),
    "start": (lambda v: v is None or _is_number(v), "a time stamp"),
    "end": (lambda v: v is None or _is_number(v), "a time stamp"),
    "nodes": (lambda v: isinstance(v, list), "a list of hosts"),
    "message": (lambda v: isinstance(v, str), "a string"),
}
"""The keys of an attempt that readers rely on (``attempts_note``, the goodput ledger), with what each holds."""


def checked_attempts(run_dir: RunDir) -> tuple[list[dict[str, Any]], list[str]]:
    """The supervisor's attempts (what ``RunDir.read_attempts`` reads), less what is damaged, with a line for
    each damaged record: an entry that is no JSON object is left out, a key of the wrong type is dropped."""
    path = run_dir.attempts
    records, unreadable = _load(path)
    if unreadable:
        return [], [unreadable]
    if records is None:
        return [], []
    if not isinstance(records, list):
        return [], [f"{path}: holds a JSON {type(records).__name__}, not a list of attempts: ignored"]
    attempts: list[dict[str, Any]] = []
    damaged: list[str] = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            damaged.append(f"{path}: entry {index} is {record!r:.80}, not a JSON object: ignored")
            continue
        clean = dict(record)
        for key, (valid, what) in _ATTEMPT_FIELDS.items():
            if key in record and not valid(record[key]):
                damaged.append(f"{path}: entry {index}: {key}={record[key]!r:.80} is not {what}")
                del clean[key]
        attempts.append(clean)
    return attempts, damaged


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


def _reported_failures(statuses: dict[int, dict[str, Any]]) -> list[str]:
    """The failures the ranks wrote, while the job may still run (a live rank may yet report)."""
    return [str(f) for f in rank_failures(statuses, gone=lambda status: False)]


def _reasons(statuses: dict[int, dict[str, Any]], world_size: int) -> list[str]:
    """Why an ended job did not complete: ranks still marked live when it ended (killed, or never got to
    report), ranks that never started, and the failures the others reported."""
    missing = [f"rank {rank} never started" for rank in never_started(statuses, world_size)]
    failures = rank_failures(statuses, gone=lambda status: True)  # the job has ended: no rank is live
    return [str(f) for f in failures if not f.reported] + missing + [str(f) for f in failures if f.reported]


def _failure(attempt: dict[str, Any]) -> dict[str, Any]:
    """An attempt's failure record ({} when it has none, or a damaged one)."""
    failure = attempt.get("failure")
    return failure if isinstance(failure, dict) else {}


def attempts_note(attempts: list[dict[str, Any]]) -> str:
    """What the supervisor says about the attempts (``RunDir.read_attempts``): the attempt running, the failures
    retried, and a fatal failure or the limit that ended the job (empty for a run without a supervisor)."""
    if not attempts:
        return ""
    last = attempts[-1]
    number, outcome = last.get("attempt"), last.get("outcome")
    failure = _failure(last)
    failures = [a for a in attempts if _failure(a)]
    if outcome == "fatal":
        return f"attempt {number}: fatal failure, not retried or requeued (exit {EXIT_FATAL}): {failure.get('describe', '?')}"
    if outcome == "gave_up":
        return f"attempt {number}: gave up (exit {EXIT_GAVE_UP}): {last.get('message', '?')}; last failure: {failure.get('describe', '?')}"
    retried = ""
    if failures:
        latest = _failure(failures[-1])
        retried = f" after {len(failures)} failure(s) retried in the allocation (last: {latest.get('describe', '?')})"
    return f"attempt {number} {outcome}{retried}"


def job_state(run_dir: RunDir, world_size: int) -> JobState:
    """Reconcile every source into one state for the run in ``run_dir``."""
    record = run_dir.read_job_record()
    job_id = str(record.get("job_id", ""))
    statuses, damaged = checked_statuses(run_dir)
    attempts, damaged_attempts = checked_attempts(run_dir)
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
    if all_ranks(statuses, world_size, RankState.COMPLETED):
        retried = notes if len(attempts) > 1 else []
        return verdict("COMPLETED", done=True, ok=True, detail="; ".join(["every rank completed", *retried]))
    failures = _reported_failures(statuses)
    if squeue in ACTIVE_STATES:
        return verdict(squeue, done=False, ok=False, detail="; ".join([*notes, *failures]))
    if squeue == UNREACHABLE and sacct is None:
        detail = "; ".join(["squeue could not reach slurmctld and sacct gave nothing", *failures])
        return verdict("UNKNOWN", done=False, detail=detail)
    scheduler = sacct if squeue in (None, UNREACHABLE) else squeue
    batch = run_dir.read_batch_exit()
    reasons = [*notes, *_reasons(statuses, world_size)]
    if "exit_code" in batch:
        reasons.append(f"the job script exited with status {batch['exit_code']}")
    if scheduler is not None:
        if scheduler == "COMPLETED":  # the scheduler saw a clean exit, but not every rank finished its work
            return verdict("FAILED", done=True, ok=False, detail="; ".join(["Slurm says COMPLETED", *reasons]))
        return verdict(scheduler, done=True, ok=False, detail="; ".join(reasons))
    if not job_id:
        return _without_scheduler(run_dir, statuses, world_size, verdict)
    # Not in squeue, no accounting: the job has ended (or its id is wrong).
    if not statuses and not batch:
        return verdict("ENDED", done=True, detail="Slurm no longer lists the job and no rank ever started")
    return verdict("FAILED", done=True, detail="; ".join(reasons) or "ended before every rank completed")


def resume_command(run_dir: RunDir) -> str:
    """The command that resumes a local run in its own run dir from its latest checkpoint."""
    words = [f"hydra.run.dir={run_dir.path}", *run_dir.read_overrides()]
    return " ".join(["python -m hpc_train", *(shlex.quote(w) for w in words)])


def _without_scheduler(
    run_dir: RunDir, statuses: dict[int, dict[str, Any]], world_size: int, verdict: Callable[..., JobState]
) -> JobState:
    """A run with no scheduler job (cluster=local or debug): the ranks' files, and whether the processes that
    wrote them still run (a rank killed, or whose terminal was closed, never writes its end)."""
    if not statuses:
        return verdict("UNKNOWN", done=False, detail="no job id and no rank status in this run dir")
    alive = {rank: rank_process_alive(s) for rank, s in statuses.items() if is_live(s)}
    running = sorted(rank for rank, up in alive.items() if up is not False)
    failures = rank_failures(statuses, gone=lambda status: rank_process_alive(status) is False)
    if failures:
        return verdict("FAILED", done=not running, detail=_local_failure(run_dir, failures, running))
    if any(up is None for up in alive.values()):
        host = next(str(statuses[rank].get("host")) for rank, up in alive.items() if up is None)
        return verdict("RUNNING?", done=False, detail=f"local run on {host}: its processes cannot be checked here")
    if running:
        pids = ", ".join(str(statuses[rank].get("pid")) for rank in running)
        return verdict("RUNNING", done=False, detail=f"local run; the ranks' processes run (pid {pids})")
    missing = never_started(statuses, world_size)
    if missing:
        return verdict("FAILED", done=True, detail=f"ranks {missing} never started")
    if {str(s.get("state")) for s in statuses.values()} <= {RankState.STOPPED.value, RankState.COMPLETED.value}:
        steps = [int(s["step"]) for s in statuses.values() if s.get("step") is not None]
        detail = f"stopped {at_step(max(steps) if steps else None)} on a signal; resume: {resume_command(run_dir)}"
        return verdict("STOPPED", done=True, detail=detail)
    return verdict("UNKNOWN", done=False, detail="the ranks' statuses name no known state")


def _local_failure(run_dir: RunDir, failures: list[RankFailure], running: list[int]) -> str:
    """Which ranks failed or died, and what to do: cancel the ranks left, or resume from the last checkpoint."""
    notes = [str(f) for f in failures]
    if any(not f.reported for f in failures):
        notes.append("a local rank that ends without a word was killed (SIGKILL, out of memory, its terminal closed)")
    checkpoints = run_dir.checkpoint_files()
    if running:
        notes.append(f"ranks {running} still run; end them with: python -m hpc_train.jobs cancel {run_dir.path}")
    elif checkpoints:
        notes.append(f"resume from {checkpoints[-1].name}: {resume_command(run_dir)}")
    return "; ".join(notes)
