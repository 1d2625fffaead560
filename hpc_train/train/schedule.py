"""Learning-rate schedules over optimizer steps: linear warmup, then constant, cosine or step decay."""

from __future__ import annotations

import math

import torch

from hpc_train.config import ScheduleConfig

__all__ = ["build_scheduler", "lr_factor"]


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """The multiplier of the peak LR for the optimizer step that comes after ``step`` completed steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    after = step - cfg.warmup_steps
    if cfg.name == "cosine":
        progress = min(1.0, after / max(1, total_steps - cfg.warmup_steps - 1))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.name == "step":
        return float(cfg.gamma ** (after // cfg.step_every))
    return 1.0


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
