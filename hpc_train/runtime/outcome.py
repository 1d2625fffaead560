"""What one rank's run came to: the state it ends in, and what training reported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpc_train.core.records import RankState

__all__ = ["Fit", "Outcome"]


@dataclass(frozen=True, kw_only=True)
class Fit:
    """What ``Trainer.fit`` reported, kept after the trainer is released."""

    completed: bool
    """False: stopped on a signal after every rank saved the checkpoint of ``step``."""
    start_step: int | None
    step: int | None
    """None for a user's script that did not report its steps (``hpc_train.preemption.should_stop(step)``)."""
    signal: int
    peak: Mapping[str, float] = field(default_factory=dict)
    """The peak GPU memory the heartbeats had (empty on CPU); the final status keeps it."""


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

    @property
    def extra(self) -> dict[str, float | str]:
        """The status's keys beyond its state and step: signal, requeued and the peak memory, where known."""
        named = {"signal": self.signal, "requeued": self.requeued}
        return {**{key: value for key, value in named.items() if value is not None}, **self.peak}
