"""What a failed training step died of, and whether starting it again can help.

The supervisor calls ``classify`` once srun has ended without every rank completing. It has three witnesses:
srun's own lines about its tasks (``srun: error: node2: task 3: Killed``: the first is the task that ended
first, the likely cause), the node failures srun reports, and the status each rank wrote (a Python error with
its traceback, a watchdog report, or nothing at all for a rank that was killed).

Retryable: a rank killed by a signal, a node lost, a collective or rendezvous error, a hang the watchdog
caught, and a Python exception the first time it is seen. Fatal: the same exception from the same step on two
attempts in a row, an import error, a config error, and divergence (a non-finite loss or state). Hosts blamed for
a retryable failure are its ``suspects``: the supervisor leaves them out of the next attempt when it has spare
nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hpc_train.core.records import (
    FATAL_KINDS,
    RETRYABLE_KINDS,
    AttemptOutcome,
    Failure,
    FailureKind,
    RankState,
    RankStatus,
)
from hpc_train.train.watchdog import FROZEN

__all__ = [
    "CANCELLED",
    "FATAL_KINDS",
    "RETRYABLE_KINDS",
    "AttemptEnd",
    "Failure",
    "FailureKind",
    "SrunReport",
    "StepEnd",
    "attempt_outcome",
    "classify",
]

Statuses = Mapping[int, RankStatus]

# srun's own lines only: a task's output never starts with "srun:" (srun prefixes nothing to it).
_TASK_LINE = re.compile(r"^srun: error: (?P<host>[^\s:]+): tasks? (?P<tasks>\d+)[\d,\-]*: (?P<what>.+?)\s*$")
_NODE_LINE = re.compile(
    r"^srun: (?:error|warning|fatal): .*?(?:[Nn]ode failure on|launch failed on node|"
    r"Communication connection failure.*?on) (?P<host>[A-Za-z0-9_.\-\[\]]+)"
)
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}
_CONFIG_ERRORS = {"ConfigError", "ConfigAttributeError", "ConfigKeyError", "ValidationError", "MissingMandatoryValue"}
_COLLECTIVE_ERRORS = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}
# Errors a collective raises as plain types. Only their messages are read for the words below, so that a user's
# own KeyError('restore') or ValueError('timeout must be > 0') stays an exception, and repeats are fatal.
_COLLECTIVE_CARRIERS = {
    "RuntimeError",
    "ConnectionError",
    "ConnectionResetError",
    "ConnectionAbortedError",
    "ConnectionRefusedError",
    "BrokenPipeError",
    "TimeoutError",
    "OSError",
}
_COLLECTIVE_WORDS = re.compile(
    r"\b(?:gloo|nccl|c10d|tcpstore|rendezvous)\b|connection (?:reset|closed|refused)|broken pipe|"
    r"closed by peer|connection timed out|\bsocket (?:timeout|timed out|closed)|unable to (?:write|read) from",
    re.IGNORECASE,
)
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning))(?::\s*(?P<msg>.*))?$"
)


@dataclass
class SrunReport:
    """What srun said on stderr about its tasks and nodes, in the order it said it."""

    task_exits: list[tuple[str, int, str]]
    """(host, first task id, what): 'Killed', 'Exited with exit code 1', 'Terminated', ..."""
    lost_nodes: list[str]

    @classmethod
    def parse(cls, lines: Iterable[str]) -> SrunReport:
        report = cls([], [])
        for line in lines:
            task = _TASK_LINE.search(line)
            if task:
                report.task_exits.append((task["host"], int(task["tasks"]), task["what"]))
                continue
            node = _NODE_LINE.search(line)
            if node and node["host"] not in report.lost_nodes:
                report.lost_nodes.append(node["host"])
        return report


def _hang_suspects(statuses: Statuses) -> tuple[str, ...]:
    """Who froze: ranks whose own watchdog saw that the process was not running; else those that did not
    report the hang (silent, or failed otherwise once woken), while the others did."""
    errors = {rank: (s.error or "") if s.state is RankState.FAILED else "" for rank, s in statuses.items()}
    frozen = [rank for rank, error in errors.items() if FROZEN in error]
    if not frozen:
        frozen = [rank for rank, error in errors.items() if not error.startswith("watchdog:")]
        if len(frozen) == len(statuses):
            return ()
    return tuple(sorted({statuses[rank].host or "" for rank in frozen} - {""}))


def _silent_hosts(statuses: Statuses) -> tuple[str, ...]:
    """Hosts of ranks still marked live once the step has ended: they died (or froze) without a word."""
    hosts = {s.host for s in statuses.values() if s.state.live}
    return tuple(sorted(h for h in hosts if h))


def _error_kind(error: str, traceback: str) -> tuple[FailureKind, str]:
    """(kind, error) from a reported error ``"Type: message"``; a user script's error is read from the last
    exception line of its stderr."""
    if error.startswith("watchdog:"):
        return FailureKind.HANG, error
    type_name = error.split(":", 1)[0].rsplit(".", 1)[-1]
    if type_name == "ScriptError":
        if " was killed by " in error:
            return FailureKind.KILLED, error
        for line in reversed(traceback.splitlines()):
            found = _EXCEPTION_LINE.match(line.strip())
            if found:
                error = line.strip()
                type_name = found["type"].rsplit(".", 1)[-1]
                break
        else:
            return FailureKind.EXCEPTION, error
    if type_name == "Diverged":  # non-finite loss or weights: another attempt from the same state diverges again
        return FailureKind.DIVERGED, error
    if type_name in _IMPORT_ERRORS:
        return FailureKind.IMPORT, error
    if type_name in _CONFIG_ERRORS:
        return FailureKind.CONFIG, error
    if type_name in _COLLECTIVE_ERRORS or (type_name in _COLLECTIVE_CARRIERS and _COLLECTIVE_WORDS.search(error)):
        return FailureKind.COLLECTIVE, error
    return FailureKind.EXCEPTION, error


def _from_status(rank: int, status: RankStatus, statuses: Statuses) -> Failure:
    traceback = status.traceback or ""
    kind, error = _error_kind(status.error or "?", traceback)
    host = status.host or "?"
    suspects: tuple[str, ...] = ()
    if kind == FailureKind.KILLED:
        suspects = (host,)
    elif kind == FailureKind.HANG:
        suspects = _hang_suspects(statuses)
    step = status.failed_step if status.failed_step is not None else status.step
    return Failure(kind=kind, rank=rank, host=host, error=error, traceback=traceback, step=step, suspects=suspects)


CANCELLED = "cancelled by `python -m hpc_train.jobs cancel`"
"""The message of an attempt whose step was ended on request (a pack member's ``jobs cancel``)."""


@dataclass(frozen=True)
class StepEnd:
    """What an attempt's step left when srun exited, as the supervisor saw it: all ``attempt_outcome`` reads."""

    statuses: Statuses
    """The ranks' statuses from this attempt."""
    ranks: int
    exit_code: int
    srun: SrunReport
    stop_signal: int
    """cluster.signal's number: ranks that stopped on it (or requeued the job) stopped the attempt."""
    signalled: bool = False
    """The supervisor itself got a stop signal (scancel, Slurm's requeue, a Ctrl-C)."""
    cancelled: bool = False
    """``jobs cancel`` asked for this run (a pack's member): its ranks were stopped."""
    launch_timeout_s: float | None = None
    """No rank started within this many seconds, and the supervisor ended srun (None: the step launched)."""
    previous: Failure | None = None
    """The failure of the attempt before, to tell a repeated exception."""


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended: its outcome, its failure (FAILED only) and a message (CANCELLED's)."""

    outcome: AttemptOutcome
    failure: Failure | None = None
    message: str = ""


def attempt_outcome(end: StepEnd) -> AttemptEnd:
    """How the attempt whose step ended as ``end`` says came out, in this order: every rank completed; cancelled
    on request; stopped by a signal (the supervisor's own, or the preemption signal the ranks stopped on; ranks
    that stopped on the SIGTERM srun sends after another task failed do not count: that is a failure); else
    failed, of what ``classify`` finds."""
    statuses = end.statuses
    if all(r in statuses and statuses[r].state is RankState.COMPLETED for r in range(end.ranks)):
        return AttemptEnd(AttemptOutcome.COMPLETED)
    if end.cancelled:
        return AttemptEnd(AttemptOutcome.STOPPED, message=CANCELLED)
    stopped = any(
        s.state is RankState.STOPPED and (s.signal == end.stop_signal or s.requeued) for s in statuses.values()
    )
    if end.signalled or stopped:
        return AttemptEnd(AttemptOutcome.STOPPED)
    failure = classify(statuses, end.srun, end.exit_code, end.previous, end.launch_timeout_s)
    return AttemptEnd(AttemptOutcome.FAILED, failure=failure)


def classify(
    statuses: Statuses,
    srun: SrunReport,
    exit_code: int,
    previous: Failure | None = None,
    launch_timeout_s: float | None = None,
) -> Failure:
    """The failure of a step that ended with ``exit_code`` before every rank completed. ``previous`` is the
    failure of the attempt before, to tell a repeated exception. ``launch_timeout_s``: no rank started within
    it, and the supervisor ended srun; whatever srun then said is about its ending, not a cause."""
    if launch_timeout_s is not None:
        error = f"no rank of the step started within {launch_timeout_s:.0f}s; the supervisor ended srun"
        return Failure(kind=FailureKind.UNKNOWN, error=error)
    failure = _classify(statuses, srun, exit_code)
    if failure.kind == FailureKind.EXCEPTION and failure.same_as(previous):
        return replace(failure, kind=FailureKind.REPEATED_EXCEPTION)
    return failure


def _classify(statuses: Statuses, srun: SrunReport, exit_code: int) -> Failure:
    if srun.lost_nodes:
        host = srun.lost_nodes[0]
        return Failure(
            kind=FailureKind.NODE_LOST, host=host, error=f"srun lost node {host}", suspects=tuple(srun.lost_nodes)
        )
    if srun.task_exits:
        host, rank, what = srun.task_exits[0]
        status = statuses.get(rank)
        if status is not None and status.state is RankState.FAILED:
            failure = _from_status(rank, status, statuses)
            if failure.kind != FailureKind.COLLECTIVE:
                return failure
            # srun saw a peer's error first ("connection closed by peer"): the cause is a rank that failed on its
            # own, whichever srun reported last, or else one that died without a word.
            causes = [f for f in _reported(statuses) if f.kind != FailureKind.COLLECTIVE]
            if causes:
                return causes[0]
            silent = _silent_hosts(statuses)
            if silent:
                error = f"ranks ended without reporting; the others then failed: {failure.error}"
                return replace(
                    failure, kind=FailureKind.KILLED, rank=None, host=silent[0], error=error, suspects=silent
                )
            return failure
        error = f"the process ended without reporting an error: {what}"
        step = status.step if status is not None else None
        return Failure(kind=FailureKind.KILLED, rank=rank, host=host, error=error, step=step, suspects=(host,))
    reported = _reported(statuses)
    if reported:
        return reported[0]
    silent = _silent_hosts(statuses)
    if silent:
        return Failure(kind=FailureKind.KILLED, host=silent[0], error="ranks ended without reporting", suspects=silent)
    return Failure(kind=FailureKind.UNKNOWN, error=f"srun exited with status {exit_code} and no rank reported why")


def _reported(statuses: Statuses) -> list[Failure]:
    """The failures the ranks reported themselves, earliest first."""
    ranks = sorted((s.time or 0, rank) for rank, s in statuses.items() if s.state is RankState.FAILED)
    return [_from_status(rank, statuses[rank], statuses) for _, rank in ranks]
