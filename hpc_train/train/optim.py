"""Optimizer construction and the learning-rate scaling rule."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hpc_train.config import AdamWConfig, SGDConfig

__all__ = ["build_optimizer", "scaled_lr"]


def scaled_lr(base_lr: float, rule: str, global_batch: int, reference_batch: int) -> float:
    """The LR for ``global_batch`` when ``base_lr`` was tuned at ``reference_batch``.

    linear (Goyal et al.): for SGD-like optimizers the update is a sum of per-sample gradients, so k times the
    batch takes k times the step. sqrt (Hoffer et al.; Malladi et al. for Adam): adaptive optimizers already
    normalise the step, and the gradient noise falls with the square root of the batch. none: keep the LR.
    """
    ratio = global_batch / reference_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    assert rule == "none", f"unknown LR scaling rule {rule!r} passed config validation"
    return base_lr


def build_optimizer(
    cfg: AdamWConfig | SGDConfig, params: Iterable[torch.nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names, at learning rate ``lr``."""
    if isinstance(cfg, SGDConfig):
        return torch.optim.SGD(
            params, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay
        )
    params = list(params)
    beta1, beta2 = cfg.betas
    fused = cfg.fused if cfg.fused is not None else bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(
        params, lr=lr, betas=(beta1, beta2), eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None
    )
