"""Stop requests from signals: the handler only records the signal; the ranks agree at a step boundary.

Slurm sends the preemption / time-limit signal (``cluster.signal``, USR2 by default) and, later, SIGTERM; a
terminal sends SIGINT. Doing I/O or a collective inside a handler can deadlock (the handler runs between two
bytecodes of whatever the main thread was doing, possibly inside a collective), so the handler sets a number
and returns. After every optimizer step the trainer all-reduces that number with MAX: if any rank got a
signal, all ranks see it at the same step, checkpoint together and stop.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["StopSignals", "signal_number"]


def signal_number(name: str) -> int:
    """``USR2``, ``SIGUSR2`` or ``usr2`` -> signal.SIGUSR2."""
    return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])


class StopSignals:
    """Catches ``signums`` while installed; ``received`` is the first one caught (0: none)."""

    def __init__(self, signums: Iterable[int]) -> None:
        self.signums = sorted(set(signums))
        self.received = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Nothing but an assignment: see the module docstring.
        if not self.received:
            self.received = signum

    def install(self) -> StopSignals:
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def agree(self, group: Any, device: torch.device) -> int:
        """The signal any rank of ``group`` received (0: none); a collective, so every rank calls it each step."""
        # torch is imported here, not at the top: the launcher imports this module (signal_number) and must
        # not pay torch's start-up second before it has started a single rank.
        import torch
        import torch.distributed as dist

        if dist.get_world_size(group) == 1:  # nobody to agree with: no collective
            return self.received
        flag = torch.tensor([self.received], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return int(flag.item())
