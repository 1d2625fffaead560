"""Stragglers: the rank whose own work per step stays slower than the others', named with its node and device.

In data-parallel training every step waits for the slowest rank, so one slow GPU, node or link slows the whole
job and nothing fails. A rank's step time says nothing about which rank it was: every rank's step is as long as
the slowest one's. What differs is the part of the step a rank spends on its own work, before it waits for the
others' gradients.

**What is measured** (``ComputeClock``, hooks on the model: no change to the user's training code). Each forward
of the model starts the rank's clock (a forward pre-hook on the model inside DDP, so DDP's own buffer broadcast
is not counted); the end of the backward pass that follows stops it (an autograd callback queued from the first
parameter's gradient hook, which runs when every gradient of this rank is computed and before DDP waits for the
others' all-reduce). That interval, summed over a step's micro-batches, is the rank's own time: its forward and
backward compute, with none of the wait at the gradient all-reduce. On a GPU it is read from CUDA events recorded
on the compute stream (the host runs ahead of the GPU, so host clocks would measure the queue), without a
synchronisation: an event pair is read once the GPU has passed it.

What it does not see: data loading and the optimizer step (outside the interval), and a slow link: the all-reduce
itself is the same wait on every rank, so a link that slows it slows every rank alike and names nobody.

**What is judged** (``StragglerJudge``, on rank 0, over what every rank measured in a window): a rank whose own
time per step stays at least ``margin`` times the median of the *other* ranks' for ``windows`` windows in a row
is a straggler (``others_median``: a slow rank's own figure, or a slow half of the ranks, cannot move its
reference). The job's step lasts as long as its slowest rank's, so it loses ``1 - others / slowest`` of its
samples per second to the straggler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hpc_train.core.records import RankTableEntry, SlowRank, StragglerReport

__all__ = [
    "ComputeClock",
    "RankWindow",
    "StragglerJudge",
    "StragglerWatch",
    "device_name",
    "others_median",
    "rank_places",
]


class ComputeClock:
    """A rank's own time in its training steps (module docstring): hooks on ``module`` (the model inside DDP), on
    the host clock, or on CUDA events for a module on a GPU. ``take()`` returns what was measured since the last
    call. ``close()`` removes the hooks."""

    EVENTS = 4096
    """CUDA event pairs kept unread at most (a safeguard: the GPU finishes them a few steps behind the host, and
    each backward reads those it has finished)."""

    def __init__(self, module: torch.nn.Module, device: torch.device | None = None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self._started: float | None = None
        self._start_event: Any = None
        self._backward_queued = False
        self._seconds = 0.0
        self._intervals = 0
        self._pending: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()
        """``take`` may come from another thread (a script's reporter) than the hooks' updates."""
        self._handles = [module.register_forward_pre_hook(self._forward)]
        self._handles += [
            p.register_post_accumulate_grad_hook(self._gradient) for p in module.parameters() if p.requires_grad
        ]

    def _forward(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():  # validation, generation: no backward follows
            return
        self._backward_queued = False
        if self.cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        else:
            self._started = time.perf_counter()

    def _gradient(self, parameter: torch.Tensor) -> None:
        if self._backward_queued:
            return
        self._backward_queued = True
        # Runs once the backward pass has computed every gradient, before DDP's own end-of-backward callback
        # (queued later, at its last bucket) waits for the all-reduce.
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        if self.cuda:
            if self._start_event is None:
                return
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            with self._lock:
                self._pending = [*self._pending[-(self.EVENTS - 1) :], (self._start_event, end)]
                self._read_finished()
            self._start_event = None
        elif self._started is not None:
            with self._lock:
                self._seconds += time.perf_counter() - self._started
                self._intervals += 1
            self._started = None

    def take(self) -> tuple[float, int]:
        """(seconds of own work, forward-backward intervals) measured since the last ``take``; on a GPU, the
        intervals the GPU has finished (those still running are counted at a later take)."""
        with self._lock:
            if self.cuda:
                self._read_finished()
            taken = self._seconds, self._intervals
            self._seconds, self._intervals = 0.0, 0
        return taken

    def _read_finished(self) -> None:
        """Count the event pairs the GPU has passed: in order, from the oldest, without waiting for any (the
        caller holds the lock)."""
        done = 0
        while done < len(self._pending) and self._pending[done][1].query():
            start, end = self._pending[done]
            self._seconds += start.elapsed_time(end) / 1000.0
            done += 1
        self._intervals += done
        del self._pending[:done]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass(frozen=True)
class RankWindow:
    """One rank's figures for one window: its own seconds per optimizer step, and where it runs."""

    rank: int
    per_step_s: float
    host: str = ""
    device: str = ""


@dataclass
class StragglerJudge:
    """Rank 0's verdicts, window after window (module docstring). ``margin``: how many times the other ranks'
    median a rank's own time must be to count as slow; ``windows``: for how many windows in a row before it is named."""

    margin: float = 1.25
    windows: int = 3
    slow_since: dict[int, tuple[int | None, float, int]] = field(default_factory=dict)
    """Each rank slow in the latest window: (the step and time its run of slow windows began, their count)."""
    judged_until: float = 0.0
    """The newest figure judged so far (a judge that reads figures as they come judges each only once)."""

    def judge(self, figures: Sequence[RankWindow], step: int | None, now: float | None = None) -> StragglerReport:
        """This window's report: every rank that has been slow for ``windows`` windows, slowest first. Ranks
        that measured nothing in the window (no step: ``per_step_s`` 0) take no part."""
        now = time.time() if now is None else now
        timed = [f for f in figures if f.per_step_s > 0]
        if len(timed) < 2:
            self.slow_since.clear()
            return StragglerReport(
                time=now, step=step, median_s=timed[0].per_step_s if timed else 0.0, ranks_measured=len(timed)
            )
        others = others_median(timed)
        slow = {f.rank: f for f in timed if f.per_step_s >= self.margin * others[f.rank]}
        self.slow_since = {
            rank: (
                (self.slow_since[rank][0], self.slow_since[rank][1], self.slow_since[rank][2] + 1)
                if rank in self.slow_since
                else (step, now, 1)
            )
            for rank in slow
        }
        named = [
            SlowRank(
                rank=f.rank,
                host=f.host,
                device=f.device,
                slowdown=round(f.per_step_s / others[f.rank], 3),
                per_step_s=round(f.per_step_s, 6),
                since_step=self.slow_since[f.rank][0],
                since_time=self.slow_since[f.rank][1],
                windows=self.slow_since[f.rank][2],
            )
            for f in sorted(slow.values(), key=lambda f: -f.per_step_s)
            if self.slow_since[f.rank][2] >= self.windows
        ]
        slowest = max(timed, key=lambda f: f.per_step_s)
        return StragglerReport(
            time=now,
            step=step,
            median_s=round(others[slowest.rank], 6),
            slowest_s=round(slowest.per_step_s, 6),
            ranks=tuple(named),
            ranks_measured=len(timed),
        )


def others_median(figures: Sequence[RankWindow]) -> dict[int, float]:
    """Each rank's reference: the median of every other rank's own time per step (at least two ranks).

    Not the median of all: a rank's own figure would move its reference, and where the slow ranks are half of
    them (one slow node of two) the median of all sits between slow and fast. Leaving the rank out, a slow rank
    is compared with the fast ones as long as the slow ones are at most half; a slow majority is the job's pace.
    One sort, then each rank's median in constant time (rank 0 judges every rank of a 1,000-node job)."""
    order = sorted(figures, key=lambda f: f.per_step_s)
    values = [f.per_step_s for f in order]
    n = len(values)

    def without(i: int, k: int) -> float:  # the k-th smallest once the i-th smallest is left out
        return values[k] if k < i else values[k + 1]

    middle = (n - 1) // 2  # of the n - 1 left: the upper middle one, and the lower one too when n - 1 is even
    return {
        f.rank: (without(i, middle) if (n - 1) % 2 else (without(i, middle - 1) + without(i, middle)) / 2)
        for i, f in enumerate(order)
    }


class StragglerWatch:
    """The straggler search of one rank's training loop: its ``ComputeClock``, rank 0's vote that a window is
    over, the gather of every rank's figure to rank 0 and rank 0's ``StragglerJudge``.

    The loop calls ``due()`` after each step and passes the vote to the ranks' per-step agreement (a MAX, so
    rank 0's clock decides for all); when the agreement says so, every rank calls ``exchange(step, group)`` at
    that same step: one gather of one number per rank, to rank 0, which judges and hands the report to
    ``on_report`` (its log, ``status/``, the trackers).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device,
        *,
        rank: int,
        window_s: float,
        margin: float,
        windows: int,
        where: Mapping[int, tuple[str, str]] | None = None,
        on_report: Callable[[StragglerReport], None] | None = None,
    ) -> None:
        self.clock = ComputeClock(module, device)
        self.rank, self.window_s = rank, window_s
        self.judge = StragglerJudge(margin=margin, windows=windows)
        self.where = dict(where or {})
        self.on_report = on_report
        self._window_started = time.monotonic()
        self._voted = False
        self._last_step: int | None = None

    def start(self, step: int) -> None:
        """Training starts (or resumes) at ``step``: the first window begins, what came before is dropped."""
        self.clock.take()
        self._last_step = step
        self._window_started = time.monotonic()
        self._voted = False

    def due(self) -> int:
        """Rank 0's vote after a step: 1 once per window (the vote is agreed a step later)."""
        if self.rank != 0 or self._voted or time.monotonic() - self._window_started < self.window_s:
            return 0
        self._voted = True
        return 1

    def exchange(self, step: int, group: Any = None) -> StragglerReport | None:
        """Every rank at the same step: send rank 0 this rank's own seconds per step since the last exchange;
        rank 0 returns its verdict (None elsewhere)."""
        # torch only in the exchange: the supervisor and a script's worker import the verdicts without it
        import torch.distributed as dist

        seconds, _ = self.clock.take()
        steps = step - (self._last_step if self._last_step is not None else step)
        self._last_step = step
        self._window_started, self._voted = time.monotonic(), False
        mine = torch.tensor([seconds / steps if steps > 0 else 0.0], dtype=torch.float64)
        world = dist.get_world_size(group)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)] if self.rank == 0 else None
        dist.gather(mine, gathered, dst=0, group=group)
        if gathered is None:
            return None
        figures = [RankWindow(r, float(t.item()), *self.where.get(r, ("", ""))) for r, t in enumerate(gathered)]
        report = self.judge.judge(figures, step)
        if self.on_report is not None:
            self.on_report(report)
        return report

    def close(self) -> None:
        self.clock.close()


def rank_places(rows: Sequence[RankTableEntry]) -> dict[int, tuple[str, str]]:
    """Each rank's host and device from the rank table's rows (``device_name``)."""
    return {row.rank: (row.host, device_name(row.device, row.cuda_visible_devices)) for row in rows}


def device_name(device: object, visible: object = "") -> str:
    """A rank's device, a GPU also by its number on the node: ``cuda:1 (GPU 5)`` when CUDA_VISIBLE_DEVICES
    (``visible``) renumbered it."""
    name = str(device)
    listed = [v for v in str(visible or "").split(",") if v]
    index = name.partition(":")[2]
    if name.startswith("cuda:") and index.isdigit() and int(index) < len(listed):
        return f"{name} (GPU {listed[int(index)]})"
    return name
