"""What a rank says about itself (``core.records.RankStatus``), and what launchers conclude from it.

Every rank writes its state (a heartbeat while it trains); the local launcher, the Slurm follower,
``hpc_train.jobs`` and the notebook API read the same typed records (``RunDir.rank_statuses``) through the helpers
here, so "which ranks failed, and which died without a word" is decided in one place.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from hpc_train.core.records import RankState, RankStatus

__all__ = [
    "RANK_COMMANDS",
    "RankFailure",
    "RankState",
    "all_ranks",
    "child_alive",
    "child_pids",
    "completion_notes",
    "is_live",
    "never_started",
    "parent_pid",
    "pid_alive",
    "process_command",
    "process_start",
    "rank_failures",
    "rank_process_alive",
    "signal_live_ranks",
    "unverified_rank_process",
]

Statuses = Mapping[int, RankStatus]
log = logging.getLogger(__name__)


def all_ranks(statuses: Statuses, world_size: int, state: RankState) -> bool:
    """True when each of the ``world_size`` ranks last reported ``state``."""
    return all(rank in statuses and statuses[rank].state is state for rank in range(world_size))


def never_started(statuses: Statuses, world_size: int) -> list[int]:
    return [rank for rank in range(world_size) if rank not in statuses]


@dataclass(frozen=True)
class RankFailure:
    rank: int
    host: str
    summary: str
    detail: str
    """The rank's traceback, or what its caller found (the last lines of its stderr)."""
    reported: bool
    """False when the rank died without writing its failure (killed by a signal, os._exit)."""

    def __str__(self) -> str:
        verb = "failed: " if self.reported else ""
        return f"rank {self.rank} on {self.host} {verb}{self.summary}"


def rank_failures(
    statuses: Statuses, gone: Callable[[RankStatus], bool], detail: Callable[[int], str] = lambda rank: ""
) -> list[RankFailure]:
    """The ranks that failed: first those still marked live that ``gone`` says are not (they died without a
    word, so they are the likely cause), then those that reported a failure, in the order they did."""
    found = []
    for rank, status in sorted(statuses.items(), key=lambda kv: kv[1].time or 0.0):
        host = status.host or "?"
        if status.state is RankState.FAILED:
            found.append(RankFailure(rank, host, status.error or "?", status.traceback or "", True))
        elif status.state.live and gone(status):
            step = f" after step {status.step}" if status.step is not None else ""
            summary = (
                f"stopped reporting{step}: process {status.pid or '?'} exited without reporting (killed by a "
                "signal, out of memory, os._exit?)"
            )
            found.append(RankFailure(rank, host, summary, detail(rank), False))
    return sorted(found, key=lambda f: f.reported)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces and ")"


def completion_notes(statuses: Statuses) -> list[str]:
    """The doubts the ranks noted about a run that completed (a script that exited 0 with no sign of having
    trained), each once."""
    return sorted({s.note for s in statuses.values() if s.note})


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (field 2 of its /proc/<pid>/stat); None when it is gone."""
    fields = _proc_stat(pid)
    return int(fields[1]) if fields is not None else None


def child_pids(parent: int) -> list[int]:
    """The processes on this machine whose parent is ``parent``.

    Read from ``/proc/<parent>/task/<tid>/children``: one small file per thread of ``parent``. Where the kernel
    has none (built without CONFIG_PROC_CHILDREN), every /proc/<pid>/stat is read instead (field 2): a launcher
    polls this several times a second, and a login node runs thousands of processes. The kernel lists children
    while they come and go: when one is reaped during the read, another, living child may be skipped. A caller
    that polls sees it the next time, and one that must know whether a given process lives asks
    ``child_alive``.
    """
    try:
        tasks = list(Path(f"/proc/{parent}/task").iterdir())
        listed = {int(pid) for task in tasks for pid in (task / "children").read_text().split()}
    except FileNotFoundError:
        if not Path(f"/proc/{parent}").exists():
            return []  # no such process (it ended, or there is no /proc): no children
        return _scanned_children(parent)
    except OSError:  # not readable (a /proc mounted with hidepid): the stat files may still be
        return _scanned_children(parent)
    return sorted(listed)


def _scanned_children(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[1] == str(parent):
            children.append(int(entry.name))
    return children


def child_alive(pid: int, parent: int) -> bool:
    """True while ``pid`` runs as a child of ``parent`` (not a zombie; a reused pid has another parent)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z" and fields[1] == str(parent)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (a zombie counts as dead: it has exited but was not reaped)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None when it is gone.
    Together with the pid it names one process: a pid is reused, a (pid, start) pair is not."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None else None


RANK_COMMANDS = ("hpc_train", "hpc-train", "submitit.core._submit")
"""What the command line of a process that writes rank statuses holds: ``python -m hpc_train.worker`` (Slurm,
sbatch scripts, by hand), ``python -u -m submitit.core._submit RUN_DIR/submitit`` (cluster=local), or the
launcher itself (cluster=debug runs the rank in ``python -m hpc_train`` / ``hpc-train``). Checked only for a
status without ``pid_start`` (run dirs written before it was recorded)."""


def process_command(pid: int) -> str | None:
    """The command line of ``pid`` with its arguments joined by spaces; None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def unverified_rank_process(status: RankStatus) -> str | None:
    """Why the process that now holds the pid in ``status`` cannot be taken for the rank that wrote it; None
    when it is that rank. A pid is reused once its process has exited, so a stale status may name an unrelated
    process: it is the rank only when its start time is the recorded ``pid_start`` or, for a status that
    records none (older run dirs), when its command line is a rank's (``RANK_COMMANDS``)."""
    host, here, pid = status.host, socket.gethostname(), status.pid
    if host != here:
        return f"it ran on host {host!r}, not on this one ({here}): its pid cannot be checked from here"
    if pid is None:
        return "its status records no process id"
    if not pid_alive(pid):
        return f"process {pid} no longer runs"
    recorded = status.pid_start
    if recorded is not None:
        started = process_start(pid)
        if started != recorded:
            return (
                f"process {pid} started at {started} clock ticks after boot, the rank at {recorded}: the pid now "
                "belongs to another process"
            )
        return None
    command = process_command(pid)
    if command is None:
        return f"the status records no pid_start and the command line of process {pid} cannot be read"
    if not any(marker in command for marker in RANK_COMMANDS):
        return (
            f"the status records no pid_start (an older run dir) and process {pid} runs {command[:120]!r}, no "
            "hpc_train rank: the pid now belongs to another process"
        )
    return None


def rank_process_alive(status: RankStatus) -> bool | None:
    """Whether the process that wrote ``status`` still runs; None when it ran on another host, where its pid
    cannot be checked from here. A process that now holds the pid but is another one (``unverified_rank_process``:
    it started at another time than ``pid_start``, which ``RunDir.write_status`` records) means the rank is gone."""
    if status.host != socket.gethostname():
        return None
    return unverified_rank_process(status) is None


def is_live(status: RankStatus) -> bool:
    """True when a rank last said it is starting or running (it has not reported an end)."""
    return status.state.live


def signal_live_ranks(
    statuses: Statuses, signum: int = signal.SIGTERM, refused: Callable[[int, str], object] | None = None
) -> list[tuple[int, int]]:
    """Send ``signum`` to every rank still marked live whose process runs on this host and is verified to be
    the rank (``unverified_rank_process``); returns (rank, pid) of those signalled. A live rank that cannot be
    verified (its pid now names another process, or it ran on another host) is left alone and handed to
    ``refused`` with why (logged as a warning when ``refused`` is None); one whose process has exited is not."""
    here = socket.gethostname()
    sent = []
    for rank, status in sorted(statuses.items()):
        pid = status.pid
        if not is_live(status) or (pid is not None and status.host == here and not pid_alive(pid)):
            continue  # ended, or its process has exited: nothing to stop
        why = unverified_rank_process(status)
        if why is not None:
            (refused or _log_refusal)(rank, why)
            continue
        assert pid is not None  # a verified rank has a pid
        with suppress(ProcessLookupError):
            os.kill(pid, signum)
            sent.append((rank, pid))
    return sent


def _log_refusal(rank: int, why: str) -> None:
    log.warning("rank %d not signalled: %s", rank, why)
