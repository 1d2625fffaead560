"""What the trainer tells the runtime, and what ``fit`` returns.

The trainer calls one ``StepObserver`` at fixed points (each step, a validation or a checkpoint under way, a
logged row, a checkpoint saved); the runtime decides who listens (the watchdog, the heartbeat, the goodput
progress file, a test's fault) and composes them with ``Observers``. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpc_train.core.records import StragglerReport

__all__ = ["BUILDING_MODEL", "STARTING_FIT", "FitResult", "Observers", "Serialize", "StepObserver"]

BUILDING_MODEL = "building the model"
"""``on_phase`` while the trainer is built: its data loaders are ready, the model comes next."""
STARTING_FIT = "starting training"
"""``on_phase`` once the trainer is built: the model is ready, the first step comes next."""

Serialize = Callable[[Any, IO[bytes]], None]
"""Writes a checkpoint's state into an open file (``torch.save``)."""


class StepObserver:
    """One listener to training; every hook does nothing unless overridden. Called on every rank."""

    def on_start(self, step: int) -> None:
        """``fit`` begins, from ``step`` (0, or the resumed checkpoint's)."""

    def on_step(self, step: int) -> None:
        """An optimizer step ended; ``step`` steps are done."""

    def on_phase(self, name: str) -> None:
        """Work other than a step is under way (``validating``, ``checkpointing``) and still progressing."""

    def on_row(self, step: int, memory: Mapping[str, float]) -> None:
        """A metrics row is due at ``step``; ``memory`` is this rank's peak GPU memory (empty on CPU)."""

    def on_metrics(self, row: Mapping[str, Any]) -> None:
        """A metrics row was written (to ``metrics.jsonl`` on rank 0): its step, train and validation values."""

    def on_saved(self, step: int) -> None:
        """The state of ``step`` is on disk (a checkpoint, or the final weights); rank 0 only."""

    def on_checkpoint_seconds(self, step: int, seconds: float) -> None:
        """The checkpoint of ``step`` became durable ``seconds`` after its save began; rank 0 only."""

    def on_stragglers(self, report: StragglerReport) -> None:
        """A window of straggler figures was judged (``hpc_train.distributed.stragglers``); rank 0 only."""

    def checkpoint_writer(self, serialize: Serialize) -> Serialize:
        """The serializer the checkpoints use, given the one they would use otherwise."""
        return serialize


class Observers(StepObserver):
    """Several observers as one, called in the order given."""

    def __init__(self, *observers: StepObserver) -> None:
        self.observers = observers

    def on_start(self, step: int) -> None:
        for observer in self.observers:
            observer.on_start(step)

    def on_step(self, step: int) -> None:
        for observer in self.observers:
            observer.on_step(step)

    def on_phase(self, name: str) -> None:
        for observer in self.observers:
            observer.on_phase(name)

    def on_row(self, step: int, memory: Mapping[str, float]) -> None:
        for observer in self.observers:
            observer.on_row(step, memory)

    def on_metrics(self, row: Mapping[str, Any]) -> None:
        for observer in self.observers:
            observer.on_metrics(row)

    def on_saved(self, step: int) -> None:
        for observer in self.observers:
            observer.on_saved(step)

    def on_checkpoint_seconds(self, step: int, seconds: float) -> None:
        for observer in self.observers:
            observer.on_checkpoint_seconds(step, seconds)

    def on_stragglers(self, report: StragglerReport) -> None:
        for observer in self.observers:
            observer.on_stragglers(report)

    def checkpoint_writer(self, serialize: Serialize) -> Serialize:
        for observer in self.observers:
            serialize = observer.checkpoint_writer(serialize)
        return serialize


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """What a fit came to (the trainer's, or a user script's), kept after the trainer is released."""

    completed: bool
    """False: stopped on a signal after every rank saved the checkpoint of ``step``."""
    start_step: int | None
    step: int | None
    """None for a user's script that did not report its steps (``hpc_train.preemption.should_stop(step)``)."""
    signal: int
    """The stop signal (0: none)."""
    peak: Mapping[str, float] = field(default_factory=dict)
    """This rank's peak GPU memory (empty on CPU); the final status keeps it."""
    stop_saved_s: float | None = None
    """Seconds from the stop signal to the durable checkpoint (None: not stopped, or not known here); for a user's
    script, to its exit 0 after the signal (it saved what it saves)."""
    note: str | None = None
    """A doubt about a run that completed: a user's script that exited 0 with no sign of having trained."""
