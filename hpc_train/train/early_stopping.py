"""Early stopping whose decision every rank takes together."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpc_train.config import EarlyStoppingConfig

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """Counts validations without improvement of ``cfg.monitor``.

    The metrics it sees are already reduced over all ranks, so every rank computes the same answer; rank 0's
    verdict is broadcast anyway, so that one rank can never stop while another waits in the next collective.
    """

    def __init__(self, cfg: EarlyStoppingConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.best: float | None = None
        self.bad_validations = 0

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.cfg.direction == "min":
            return value < self.best - self.cfg.min_delta
        return value > self.best + self.cfg.min_delta

    def update(self, value: float) -> tuple[bool, bool]:
        """Record one validation; returns (improved, stop now), identical on every rank."""
        improved = self._improved(value)
        if improved:
            self.best, self.bad_validations = value, 0
        else:
            self.bad_validations += 1
        stop = self.cfg.patience > 0 and self.bad_validations >= self.cfg.patience
        verdict = torch.tensor([int(improved), int(stop)], device=self.device)
        dist.broadcast(verdict, src=0)
        return bool(verdict[0]), bool(verdict[1])
