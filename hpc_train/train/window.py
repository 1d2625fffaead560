"""The steps since the last metrics row: their summed loss, their count, their time; closed into a row."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["MetricsWindow"]


class MetricsWindow:
    """One metrics row's worth of steps, on every rank.

    The loss stays a tensor on the device: reading it with .item() every step would make the host wait for the
    device each step. It is read (and reduced across ranks) only when a row is written.
    """

    def __init__(self, device: torch.device, global_batch: int, lr: float) -> None:
        self.device, self.global_batch = device, global_batch
        self.loss = torch.zeros((), device=device)
        self.steps = 0
        self.lr = lr
        """The learning rate of the latest step."""
        self.first_step_at = 0.0
        """Wall-clock time (time.time()) when the first optimizer step ended: start-up cost, in metrics.jsonl."""
        self._first_row_written = False
        self._fit_start = self._start = 0.0

    def start(self) -> None:
        """``fit`` begins: the time of the first row's window and of ``time_s`` count from here."""
        self._fit_start = self._start = time.perf_counter()

    def add(self, step_loss: torch.Tensor, lr: float) -> None:
        """One optimizer step: its loss (a tensor on the device) and the learning rate it used."""
        self.loss += step_loss
        self.steps += 1
        self.lr = lr

    def stepped(self) -> None:
        """A step ended (after ``add`` and the trainer's count): the first one marks ``first_step_at``."""
        if not self.first_step_at:
            self.first_step_at = time.time()

    def restore(self, loss: torch.Tensor, steps: int, lr: float) -> None:
        """A resumed run's window, as its checkpoint saved it (``loss`` is this rank's)."""
        self.loss.copy_(loss)
        self.steps, self.lr = steps, lr

    def close(self, step: int, epoch: int) -> dict[str, Any]:
        """Mean training loss over ranks and steps since the last row, and the global throughput; a new window
        begins. A collective: every rank calls it at the same step."""
        stats = torch.stack([self.loss, torch.tensor(float(self.steps), device=self.device)])
        dist.all_reduce(stats)  # sums over ranks: [sum of per-step mean losses, steps x world size]
        now = time.perf_counter()
        loss_sum, count = stats.tolist()
        row: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "train_loss": loss_sum / count,
            "lr": self.lr,
            "samples_per_s": self.steps * self.global_batch / max(now - self._start, 1e-9),
            "time_s": now - self._fit_start,
        }
        if not self._first_row_written:
            row["first_step_at"] = self.first_step_at
            self._first_row_written = True
        self.loss.zero_()
        self.steps = 0
        self._start = now
        return row
