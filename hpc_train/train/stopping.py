"""Stop requests from signals: the handler only records the signal; the ranks agree at a step boundary.

Slurm sends the preemption / time-limit signal (``cluster.signal``, USR2 by default) and, later, SIGTERM; a
terminal sends SIGINT. Doing I/O or a collective inside a handler can deadlock (the handler runs between two
bytecodes of whatever the main thread was doing, possibly inside a collective), so the handler sets a number
and returns. After every optimizer step the trainer all-reduces that number with MAX: if any rank got a
signal, all ranks see it at the same step, checkpoint together and stop.

The reduction is asynchronous: the one started after step k is read after step k+1, so its network round trip
overlaps a step of compute instead of stalling every step (a blocking one cost 3-5% of a 2-rank CPU step).
Every rank reads the same result at the same step, so they still stop together, one step after the signal.
Validation has no steps: there the ranks agree between batches (``heard``), about every 50 ms of rank 0's
batches, so that a stop does not wait for a long validation to end.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any

__all__ = ["EARLY_STOP_SIGNALS", "StopSignals", "signal_number"]

EARLY_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Caught from a rank's first line, before its config (and so cluster.signal) is read: any of them asks the
rank to stop, which is what each would have done anyway (USR1/USR2 kill an unprepared process).
SIGHUP (the terminal closed, an ssh session ended) is a stop like SIGTERM: the rank checkpoints."""


def signal_number(name: str) -> int:
    """``USR2``, ``SIGUSR2`` or ``usr2`` -> signal.SIGUSR2."""
    return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])


class StopSignals:
    """Catches ``signums`` while installed; ``received`` is the first one caught (0: none)."""

    def __init__(self, signums: Iterable[int]) -> None:
        self.signums = sorted(set(signums))
        self.received = 0
        self.received_at: float | None = None
        """When this process caught ``received`` (time.monotonic()); None before, or when only another rank
        caught one."""
        self.count = 0
        """How many of the signals arrived (a second Ctrl-C asks for more haste)."""
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, Any] | None = None
        """The reduction started by the last agree(): (work handle, flag tensor)."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Nothing but assignments: see the module docstring.
        self.count += 1
        if not self.received:
            self.received = signum
            self.received_at = time.monotonic()

    def install(self) -> StopSignals:
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def agree(self, group: Any) -> int:
        """The signal some rank of ``group`` had received by the previous call (0: none).

        A collective: every rank calls it after every step. It reads the reduction the previous call started
        and, unless that says stop, starts the next one with this rank's flag. A gloo group: the flag is a CPU
        tensor.
        """
        return self.agree_all(group, ())[0]

    def agree_all(self, group: Any, votes: Sequence[int]) -> tuple[int, ...]:
        """``agree`` with more to agree on: ``votes`` travel in the same reduction, and come back as their MAX
        over the ranks, one call later (at once with one rank). Every call passes the same number of votes."""
        # torch is imported here, not at the top: the launcher imports this module (signal_number) and must
        # not pay torch's start-up second before it has started a single rank.
        import torch

        # torch only in the ranks: the launcher and the supervisor import this module
        import torch.distributed as dist

        if dist.get_world_size(group) == 1:  # nobody to agree with: no collective, no delay
            return (self.received, *votes)
        agreed = self._finish() or (0,) * (1 + len(votes))
        if not agreed[0]:
            flag = torch.tensor([self.received, *votes], dtype=torch.int64)
            self._pending = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True), flag
        return agreed

    def heard(self, group: Any, vote: int = 0) -> tuple[int, int]:
        """(the signal some rank of ``group`` has received so far or 0, the MAX of ``vote`` over the ranks),
        agreed at once: a blocking collective that every rank calls at the same points, for phases without
        steps (validation). The reduction ``agree_all`` may have in flight is unaffected: both run in the order
        they were issued, the same on every rank."""
        # torch only in the ranks: the launcher and the supervisor import this module
        import torch
        import torch.distributed as dist

        if dist.get_world_size(group) == 1:
            return self.received, vote
        flag = torch.tensor([self.received, vote], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        signum, agreed = (int(v) for v in flag.tolist())
        return signum, agreed

    def settle(self) -> None:
        """Complete the reduction in flight (every rank has one at the same step) before training ends."""
        self._finish()

    def _finish(self) -> tuple[int, ...]:
        if self._pending is None:
            return ()
        work, flag = self._pending
        self._pending = None
        work.wait()  # bounded by the process group's timeout (and the watchdog)
        return tuple(int(v) for v in flag.tolist())
