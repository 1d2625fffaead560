"""The supervisor's books: the run's attempts and allocations, and the goodput ledger made from them.

``status/attempts.json``, ``status/allocations.json`` and ``status/growths.json`` have one writer, the supervisor
of the allocation that owns the run dir (``core.owner``). So the ledger reads them once, when the allocation
begins, keeps them in memory and writes every change through: the files always say what the supervisor knows,
and it never reads them back.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hpc_train.core.goodput import ledger
from hpc_train.core.identity import JobIdentity
from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Growth, Progress
from hpc_train.core.rundir import RunDir

__all__ = ["AttemptLedger"]


class AttemptLedger:
    def __init__(self, rd: RunDir, job: JobIdentity, nodes: list[str]) -> None:
        self.rd = rd
        self.job = job
        self.nodes = nodes
        """The allocation's nodes."""
        self.attempts: list[AttemptRecord] = []
        """Every attempt of the run, oldest first (a damaged entry is left out: it must not stop the recovery)."""
        self.allocations: list[Allocation] = []
        self.growths: list[Growth] = []
        """The run's stops to come back on more nodes (``runtime.grow``), for the goodput ledger."""

    def mine(self, record: AttemptRecord | Allocation | None) -> bool:
        """Whether an allocation or attempt record belongs to this allocation."""
        return record is not None and record.allocation == self.job.allocation

    @property
    def last(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    def next_number(self) -> int:
        """The number of the next attempt: one more than any before it, in this allocation or an earlier one
        (a local launcher's attempts count by their rank 0 logs)."""
        return JobIdentity.next_attempt(self.rd.logged_attempts(), [a.attempt for a in self.attempts])

    def failures_here(self) -> list[AttemptRecord]:
        """This allocation's failed attempts."""
        return [a for a in self.attempts if self.mine(a) and a.failure is not None]

    # ---- the allocation -----------------------------------------------------------------------------------

    def begin(self, asked: tuple[int, int] | None = None) -> None:
        """Read the books, close what an earlier batch step left open, and open this allocation (``asked``: the
        node range the job asked for, None for a fixed count)."""
        self.attempts = self.rd.attempt_records()
        self.allocations = self.rd.allocation_records()
        self.growths = self.rd.growth_records()
        self._close_abandoned()
        low, high = asked or (None, None)
        mine = Allocation(
            job_id=self.job.allocation[0],
            requeue=self.job.requeues,
            nodes=tuple(self.nodes),
            start=time.time(),
            min_nodes=low,
            max_nodes=high,
        )
        self.allocations.append(mine)
        self.rd.write_allocations(self.allocations)

    def end(self) -> None:
        if self.allocations and self.mine(self.allocations[-1]):
            self.allocations[-1] = replace(self.allocations[-1], end=time.time())
            self.rd.write_allocations(self.allocations)
        self.write_goodput()

    def _close_abandoned(self) -> None:
        """Close what an earlier batch step left open: it was killed before it could (Slurm ended the job on a
        node failure, a KillWait ran out). Each ends at the last time it is known to have been alive, so that
        the ledger does not count it as running until now."""
        attempts = self.attempts
        abandoned = False
        last_seen = 0.0
        for i, entry in enumerate(attempts):
            if entry.end is None:
                abandoned = True
                progress = entry.progress or (self.rd.progress_record(0) if i == len(attempts) - 1 else Progress())
                if (progress.first_time or 0) < (entry.start or 0):
                    progress = Progress()  # an earlier attempt's: this one never made a step
                seen = [t for t in (entry.start, progress.time, progress.checkpoint_time) if t is not None]
                entry = attempts[i] = replace(
                    entry,
                    end=max(seen, default=0.0),
                    progress=progress,
                    outcome=AttemptOutcome.LOST,
                    message="its batch step ended before it could record how the attempt ended",
                )
            last_seen = max(last_seen, entry.end or 0.0)
        if abandoned:
            self.rd.write_attempts(attempts)
        if any(a.end is None for a in self.allocations):
            self.allocations = [
                a if a.end is not None else replace(a, end=max(a.start, last_seen)) for a in self.allocations
            ]
            self.rd.write_allocations(self.allocations)

    # ---- attempts -----------------------------------------------------------------------------------------

    def save(self, entry: AttemptRecord) -> None:
        """Record an attempt: a new one, or a new state of the latest one. The goodput ledger follows."""
        if self.attempts and self.attempts[-1].attempt == entry.attempt:
            self.attempts[-1] = entry
        else:
            self.attempts.append(entry)
        self.rd.write_attempts(self.attempts)
        self.write_goodput()

    def add_growth(self, growth: Growth) -> None:
        """Record a decision to come back on more nodes (``status/growths.json``)."""
        self.growths.append(growth)
        self.rd.write_growths(self.growths)
        self.write_goodput()

    def write_goodput(self) -> None:
        self.rd.write_goodput(ledger(self.allocations, self.attempts, growths=self.growths).to_json())
