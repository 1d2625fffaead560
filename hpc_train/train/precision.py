"""Mixed precision: autocast to bf16/fp16, and the GradScaler fp16 needs against underflowing gradients."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

__all__ = ["Precision"]

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """``autocast()`` for forward passes and ``scaler`` for backward/step (a no-op unless fp16)."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.device_type = device.type
        self.dtype = _DTYPES[name]
        # bf16 keeps fp32's exponent range, so only fp16 needs its loss scaled.
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    def autocast(self) -> AbstractContextManager[object]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)
