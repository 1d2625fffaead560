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
    "never_started",
    "pid_alive",
    "rank_failures",
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


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (a zombie counts as dead: it has exited but was not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def signal_live_ranks(statuses: Statuses, signum: int = signal.SIGTERM) -> list[tuple[int, int]]:
    """Send ``signum`` to every rank on this host still marked live whose process runs; returns (rank, pid)."""
    host = socket.gethostname()
    sent = []
    for rank, status in sorted(statuses.items()):
        state, pid = _state(status), int(status.get("pid", 0))
        if state is not None and state.live and status.get("host") == host and pid and pid_alive(pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
                sent.append((rank, pid))
    return sent
