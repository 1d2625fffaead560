"""What a rank says about itself in ``status/rank_<r>.json``, and what launchers conclude from it.

Every rank writes its state there (a heartbeat while it trains); the local launcher, the Slurm follower,
``hpc_train.jobs`` and the notebook API read the same files through the helpers here, so "which ranks
failed, and which died without a word" is decided in one place.
"""

from __future__ import annotations

import enum
import os
import signal
import socket
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "RankFailure",
    "RankState",
    "all_ranks",
    "child_pids",
    "is_live",
    "never_started",
    "pid_alive",
    "process_start",
    "rank_failures",
    "rank_process_alive",
    "signal_live_ranks",
]

Statuses = Mapping[int, Mapping[str, Any]]


class RankState(str, enum.Enum):
    """A rank's state; written to JSON as its plain string value (enum.StrEnum needs Python 3.11)."""

    STARTING = "starting"
    """Process started, before the rendezvous (slow imports, dataset)."""
    RUNNING = "running"
    """Past the rendezvous; the status is rewritten at every logged step."""
    COMPLETED = "completed"
    """Trained to the end (or the user's script exited 0)."""
    FAILED = "failed"
    """Raised, or was ended by its watchdog; the status holds the error and a traceback."""
    STOPPED = "stopped"
    """Checkpointed on a signal (and requeued, on Slurm, within the limits)."""

    def __str__(self) -> str:
        return self.value

    @property
    def live(self) -> bool:
        """Still expected to report more."""
        return self in (RankState.STARTING, RankState.RUNNING)


def _state(status: Mapping[str, Any] | None) -> RankState | None:
    try:
        return RankState(status.get("state")) if status else None
    except ValueError:
        return None


def all_ranks(statuses: Statuses, world_size: int, state: RankState) -> bool:
    """True when each of the ``world_size`` ranks last reported ``state``."""
    return all(_state(statuses.get(rank)) is state for rank in range(world_size))


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
    statuses: Statuses, gone: Callable[[Mapping[str, Any]], bool], detail: Callable[[int], str] = lambda rank: ""
) -> list[RankFailure]:
    """The ranks that failed: first those still marked live that ``gone`` says are not (they died without a
    word, so they are the likely cause), then those that reported a failure, in the order they did."""
    found = []
    for rank, status in sorted(statuses.items(), key=lambda kv: kv[1].get("time", 0)):
        state, host = _state(status), str(status.get("host", "?"))
        if state is RankState.FAILED:
            error = str(status.get("error", "?"))
            found.append(RankFailure(rank, host, error, str(status.get("traceback", "")), True))
        elif state is not None and state.live and gone(status):
            step = f" after step {status['step']}" if "step" in status else ""
            summary = (
                f"stopped reporting{step}: process {status.get('pid', '?')} exited without reporting (killed by a "
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


def child_pids(parent: int) -> list[int]:
    """The processes on this machine whose parent is ``parent`` (field 2 of their /proc/<pid>/stat)."""
    children = []
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[1] == str(parent):
            children.append(int(entry.name))
    return children


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (a zombie counts as dead: it has exited but was not reaped)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of /proc/<pid>/stat); None when it is gone.
    Together with the pid it names one process: a pid is reused, a (pid, start) pair is not."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None else None


def rank_process_alive(status: Mapping[str, Any]) -> bool | None:
    """Whether the process that wrote ``status`` still runs; None when it ran on another host, where its pid
    cannot be checked from here. A process that now holds the pid but started at another time (``pid_start``,
    which ``RunDir.write_status`` records) is another process: the rank is gone."""
    if status.get("host") != socket.gethostname():
        return None
    pid = int(status.get("pid") or 0)
    if not pid or not pid_alive(pid):
        return False
    started = status.get("pid_start")
    return started is None or process_start(pid) == started


def is_live(status: Mapping[str, Any]) -> bool:
    """True when a rank last said it is starting or running (it has not reported an end)."""
    state = _state(status)
    return state is not None and state.live


def signal_live_ranks(statuses: Statuses, signum: int = signal.SIGTERM) -> list[tuple[int, int]]:
    """Send ``signum`` to every rank on this host still marked live whose process runs; returns (rank, pid)."""
    sent = []
    for rank, status in sorted(statuses.items()):
        if is_live(status) and rank_process_alive(status):
            pid = int(status["pid"])
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
                sent.append((rank, pid))
    return sent
