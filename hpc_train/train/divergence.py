"""Divergence: steps whose loss or gradient norm is not finite, agreed across ranks, end training.

Each optimizer step leaves a flag on the device: 1 when its loss (or the gradient norm, when clipping computes
it) is NaN or inf, unless fp16's grad scaler skipped the step (an overflow it handles by lowering the scale;
the weights are untouched). Reading the flag right away would make the host wait for the device at every step,
so the flag of step k is read after step k+1 has been queued, and travels in the same asynchronous MAX
reduction as the stop signals (``StopSignals.agree``). Every rank learns the same flags in the same order, so
all of them stop at the same step. A run has diverged after ``tolerance`` flagged steps in a row.

Nothing non-finite is ever saved: ``Checkpoints`` are checked for finite weights before they are written, so
the last checkpoint on disk is the last finite state, and rotation never replaces it with a NaN one.
"""

from __future__ import annotations

import torch

from hpc_train.core.errors import Diverged

__all__ = ["DIVERGED_HINT", "DivergenceGuard"]

DIVERGED_HINT = (
    "HINT: lower trainer.lr, add a warm-up (trainer.schedule.warmup_steps), clip gradients "
    "(trainer.grad_clip_norm=1.0), or train in fp32/bf16 rather than fp16; then start a new run from the last "
    "finite checkpoint's weights with trainer.init_from=RUN_DIR"
)


class DivergenceGuard:
    """Counts flagged steps in a row; ``tolerance`` 0 turns the guard off."""

    def __init__(self, tolerance: int) -> None:
        self.tolerance = tolerance
        self.streak = 0
        self.first_bad_step = 0
        self._latest: tuple[int, torch.Tensor] | None = None
        """The flag of the latest step: (step, device tensor), not read yet."""
        self._previous: tuple[int, torch.Tensor] | None = None
        """The flag of the step before, which the next vote reads."""

    def flag(self, step: int, loss: torch.Tensor, skipped: torch.Tensor | None = None) -> None:
        """Record step ``step``'s flag (device tensors; nothing is read here)."""
        if not self.tolerance:
            return
        bad = ~torch.isfinite(loss.detach()).all()
        if skipped is not None:
            bad = bad & ~skipped
        self._previous, self._latest = self._latest, (step, bad)

    def vote(self, final: bool = False) -> tuple[int, int]:
        """(flag, step) for the agreement, read now: the step before the latest, which the device has finished
        (or nearly: the latest is queued behind it). ``final``: training has ended, the latest is read too, one
        vote at a time. (0, 0) when there is nothing to read."""
        held = self._previous
        self._previous = None
        if held is None and final:
            held, self._latest = self._latest, None
        if held is None:
            return 0, 0
        step, bad = held
        return int(bad.item()), step

    def agreed(self, flagged: int, step: int) -> None:
        """The agreed vote (MAX over ranks) of step ``step`` (0: none); Diverged after ``tolerance`` flagged
        steps in a row."""
        if not step:
            return
        if not flagged:
            self.streak = 0
            return
        self.streak += 1
        if self.streak == 1:
            self.first_bad_step = step
        if self.streak >= self.tolerance:
            raise Diverged(
                f"training diverged: the loss or gradient norm was not finite on some rank for {self.streak} step(s) "
                f"in a row from step {self.first_bad_step} (trainer.divergence_steps={self.tolerance}); training "
                f"stopped, and the last checkpoint, which is finite, is kept. {DIVERGED_HINT}"
            )
