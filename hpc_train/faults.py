"""Deliberate faults for testing failure handling: ``HPC_TRAIN_FAULT="rank=1,step=3,kind=raise"``.

kinds: ``raise`` (a RuntimeError in the training step), ``exit`` (os._exit(3), no cleanup), ``kill`` (SIGKILL to
itself). ``step=0`` fires before the rendezvous (init_process_group), ``step=N`` after the N-th optimizer step.
The variable is read once at start; unset, the per-step check is a comparison against None.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

__all__ = ["Fault", "fault_from_env"]

KINDS = ("raise", "exit", "kill")


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    def maybe_fire(self, rank: int, step: int) -> None:
        """Fire if this is the chosen rank and step."""
        if rank != self.rank or step != self.step:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault (HPC_TRAIN_FAULT) on rank {rank} at step {step}")
        if self.kind == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)


def fault_from_env(value: str | None = None) -> Fault | None:
    """The fault ``HPC_TRAIN_FAULT`` asks for, or None."""
    raw = os.environ.get("HPC_TRAIN_FAULT", "") if value is None else value
    if not raw:
        return None
    try:
        fields = dict(item.split("=", 1) for item in raw.split(","))
        fault = Fault(rank=int(fields["rank"]), step=int(fields["step"]), kind=fields.get("kind", "raise"))
    except (KeyError, ValueError):
        raise ValueError(f"HPC_TRAIN_FAULT={raw!r}: expected 'rank=R,step=S,kind={'|'.join(KINDS)}'") from None
    if fault.kind not in KINDS:
        raise ValueError(f"HPC_TRAIN_FAULT={raw!r}: kind must be one of {', '.join(KINDS)}")
    return fault
