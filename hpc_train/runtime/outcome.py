"""What one rank's run came to: the state it ends in, and what training reported (``Fit``, the trainer's
``FitResult``, or a user script's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpc_train.core.records import RankState
from hpc_train.train.hooks import FitResult as Fit

__all__ = ["Fit", "Outcome"]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The final status this rank writes (``RunDir.write_status``)."""

    state: RankState
    """completed, or stopped (checkpointed on a signal; requeued on Slurm)."""
    step: int
    signal: int | None = None
    """The stop signal a stopped rank checkpointed on."""
    requeued: str | None = None
    """What ``scontrol requeue`` was asked to requeue."""
    peak: Mapping[str, float] = field(default_factory=dict)
    stop_saved_s: float | None = None
    """Seconds from the stop signal to the durable checkpoint it stopped with."""
    note: str | None = None
    """A doubt about a run that completed (``Fit.note``)."""

    @property
    def extra(self) -> dict[str, float | str]:
        """The status's keys beyond its state and step: signal, requeued, the seconds to a durable checkpoint
        and the peak memory, where known."""
        saved = None if self.stop_saved_s is None else round(self.stop_saved_s, 3)
        named = {"signal": self.signal, "requeued": self.requeued, "stop_saved_s": saved, "note": self.note}
        return {**{key: value for key, value in named.items() if value is not None}, **self.peak}
