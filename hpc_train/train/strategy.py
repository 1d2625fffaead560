"""How the model is spread: DDP (a process per rank), DataParallel (one process), or a single device."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc_train.config import DDPConfig

__all__ = ["wrap_model"]


def wrap_model(
    model: nn.Module, strategy: str, device: torch.device, ddp: DDPConfig, world_size: int
) -> tuple[nn.Module, Callable[[], AbstractContextManager[object]]]:
    """The wrapped model and a ``no_sync`` context for micro-steps whose gradients must not be all-reduced yet.

    DDP with a single rank would all-reduce every gradient bucket with itself after each backward: one rank
    trains the bare model instead.
    """
    if strategy == "ddp" and world_size > 1:
        wrapped = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=ddp.find_unused_parameters,
            static_graph=ddp.static_graph,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            bucket_cap_mb=ddp.bucket_cap_mb,
        )
        return wrapped, wrapped.no_sync
    if strategy == "dp":
        # Splits each batch over this process's visible GPUs (with none, it simply calls the model).
        return nn.DataParallel(model), nullcontext
    assert strategy in ("single", "ddp"), f"unknown strategy {strategy!r} passed config validation"
    return model, nullcontext
