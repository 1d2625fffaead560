"""What one rank's run came to: the state it ends in, and what training reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpc_train.core.state import RankState

__all__ = ["Fit", "Outcome"]


@dataclass(frozen=True)
class Fit:
    """What ``Trainer.fit`` reported, kept after the trainer is released."""

    completed: bool
    """False: stopped on a signal after every rank saved the checkpoint of ``step``."""
    start_step: int | None
    step: int | None
    """None for a user's script that did not report its steps (``hpc_train.preemption.should_stop(step)``)."""
    signal: int
    peak: dict[str, float]
    """The peak GPU memory the heartbeats had (empty on CPU); the final status keeps it."""


@dataclass(frozen=True)
class Outcome:
    """The final status this rank writes."""

    state: RankState
    """completed, or stopped (checkpointed on a signal; requeued on Slurm)."""
    step: int
    extra: dict[str, Any] = field(default_factory=dict)
