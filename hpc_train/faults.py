"""Deliberate faults for testing failure handling: ``HPC_TRAIN_FAULT="rank=1,step=3,kind=raise"``.

kinds: ``raise`` (a RuntimeError in the training step), ``exit`` (os._exit(3), no cleanup), ``kill`` (SIGKILL to
itself), ``term`` / ``usr2`` / ``int`` (that signal to itself, as Slurm or Ctrl-C would send it), ``hang`` (sleeps
inside the step, forever), ``freeze`` (SIGSTOP to itself: frozen, as a rank on a dead node), ``killsave`` (SIGKILL
halfway through writing the checkpoint of that step, on rank 0). ``step=0`` fires
before the rendezvous (init_process_group), ``step=N`` after the N-th optimizer step.
The variable is read once at start; unset, the per-step check is a comparison against None.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import IO

__all__ = ["Fault", "die_halfway", "fault_from_env"]

_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "usr2": signal.SIGUSR2, "int": signal.SIGINT}
KINDS = ("raise", "exit", "hang", "freeze", "killsave", *_SIGNALS)


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    def in_save(self, rank: int, step: int) -> bool:
        """True where the checkpoint of this step must die halfway (``killsave``)."""
        return self.kind == "killsave" and (rank, step) == (self.rank, self.step)

    def maybe_fire(self, rank: int, step: int) -> None:
        """Fire if this is the chosen rank and step."""
        if rank != self.rank or step != self.step or self.kind == "killsave":
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault (HPC_TRAIN_FAULT) on rank {rank} at step {step}")
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        os.kill(os.getpid(), _SIGNALS[self.kind])


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


def die_halfway(f: IO[bytes]) -> None:
    """A ``write`` callback for atomic_write that writes part of a file, then SIGKILLs this process."""
    f.write(b"\0" * 4096)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
