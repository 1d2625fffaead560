"""Deliberate faults, a testing aid: ``HPC_TRAIN_FAULT="rank=1,step=3,kind=raise"`` makes a run fail on purpose.

Not a setting for users: the test suite sets it to prove that failures are caught, reported and recovered
from. The worker reads it once, logs a warning on every rank when it is set, and passes it to the trainer as
one of its observers (``FaultObserver``: called after every step, and wrapping the checkpoint writer).

kinds: ``raise`` (a RuntimeError in the training step), ``exit`` (os._exit(3), no cleanup), ``kill`` (SIGKILL to
itself), ``term`` / ``usr2`` / ``int`` (that signal to itself, as Slurm or Ctrl-C would send it), ``hang`` (sleeps
inside the step, forever), ``freeze`` (SIGSTOP to itself: frozen, as a rank on a dead node), ``killsave`` (SIGKILL
halfway through writing the checkpoint of that step, on rank 0; a background write, trainer.checkpoint_async,
dies once training has gone on to the next step), ``termsave`` (SIGTERM to itself while writing
the checkpoint of that step, on rank 0). ``step=0`` fires before the rendezvous
(init_process_group), ``step=N`` after the N-th optimizer step. ``attempt=K`` arms it in attempt K only (the
supervisor's restarts would otherwise meet it again). ``member=M`` arms it in member M of a pack only
(``cluster.pack``: the members share the job's environment).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from hpc_train.core.identity import PACK_VARIABLE
from hpc_train.train.hooks import Serialize, StepObserver

__all__ = ["VARIABLE", "Fault", "FaultObserver", "armed_fault", "fault_from_env"]

VARIABLE = "HPC_TRAIN_FAULT"
_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "usr2": signal.SIGUSR2, "int": signal.SIGINT}
KINDS = ("raise", "exit", "hang", "freeze", "killsave", "termsave", *_SIGNALS)
_WHILE_SAVING = ("killsave", "termsave")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str
    went_on: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    """Set once this rank has trained past ``step``: a background write killed halfway waits for it, so that the
    kill comes while training goes on (as a node lost mid-write), not while the step still hands the write over."""

    def at_step(self, rank: int, step: int) -> None:
        """Called after every optimizer step (and with step 0 before the rendezvous): fire if it is time."""
        if rank == self.rank and step > self.step:
            self.went_on.set()
        if rank != self.rank or step != self.step or self.kind in _WHILE_SAVING:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault ({VARIABLE}) on rank {rank} at step {step}")
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        os.kill(os.getpid(), _SIGNALS[self.kind])

    def checkpoint_writer(self, rank: int, serialize: Serialize) -> Serialize:
        """``serialize`` for the trainer's checkpoints; on this rank, with ``killsave`` one that dies halfway
        through writing the checkpoint of the fault's step (into the temp file the ledger names), with
        ``termsave`` one that sends itself SIGTERM there and goes on writing."""
        if self.kind not in _WHILE_SAVING or rank != self.rank:
            return serialize

        def serialize_or_die(state: Any, f: IO[bytes]) -> None:
            if isinstance(state, dict) and state.get("step") == self.step:
                if self.kind == "killsave":
                    if threading.current_thread() is not threading.main_thread():
                        self.went_on.wait(timeout=30)  # bounded: a step's last checkpoint waits for this write
                    _die_halfway(f)
                os.kill(os.getpid(), signal.SIGTERM)
            serialize(state, f)

        return serialize_or_die


@dataclass(frozen=True)
class FaultObserver(StepObserver):
    """The fault as one of the trainer's observers, on this rank."""

    fault: Fault
    rank: int

    def on_step(self, step: int) -> None:
        self.fault.at_step(self.rank, step)

    def checkpoint_writer(self, serialize: Serialize) -> Serialize:
        return self.fault.checkpoint_writer(self.rank, serialize)


def fault_from_env(value: str | None = None, attempt: int = 0, member: int | None = None) -> Fault | None:
    """The fault ``HPC_TRAIN_FAULT`` asks for, or None; ValueError when it does not parse. With ``attempt=K``
    in it, the fault is armed in attempt K only (``attempt`` is this one's number); without, in every attempt.
    With ``member=M``, in member M of a pack only (``member``: this one's index, None outside a pack)."""
    raw = os.environ.get(VARIABLE, "") if value is None else value
    if not raw:
        return None
    try:
        fields = dict(item.split("=", 1) for item in raw.split(","))
        fault = Fault(rank=int(fields["rank"]), step=int(fields["step"]), kind=fields.get("kind", "raise"))
        only_in = int(fields["attempt"]) if "attempt" in fields else None
        only_member = int(fields["member"]) if "member" in fields else None
    except (KeyError, ValueError):
        expected = f"rank=R,step=S,kind={'|'.join(KINDS)}[,attempt=A][,member=M]"
        raise ValueError(f"{VARIABLE}={raw!r}: expected '{expected}'") from None
    if fault.kind not in KINDS:
        raise ValueError(f"{VARIABLE}={raw!r}: kind must be one of {', '.join(KINDS)}")
    if only_member is not None and only_member != member:
        return None
    return fault if only_in is None or only_in == attempt else None


def armed_fault(environ: Mapping[str, str] | None = None, attempt: int = 0) -> Fault | None:
    """``fault_from_env``, with a warning in every rank's log when a fault is armed: a variable left set in a
    shell would otherwise fail a real run with no hint why."""
    environ = os.environ if environ is None else environ
    pack = environ.get(PACK_VARIABLE, "")
    fault = fault_from_env(environ.get(VARIABLE, ""), attempt, int(pack.split("/")[0]) if pack else None)
    if fault is not None:
        log.warning(
            "%s is set: rank %d will fail on purpose (%s) at step %d. This is a testing aid; unset it for real runs",
            VARIABLE,
            fault.rank,
            fault.kind,
            fault.step,
        )
    return fault


def _die_halfway(f: IO[bytes]) -> None:
    """Writes part of a checkpoint into ``f``, then SIGKILLs this process."""
    f.write(b"\0" * 4096)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
