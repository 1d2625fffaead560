"""Signals in a launching process: SIGTERM read as Ctrl-C, and signals held over a step that must not be cut.

A command that is ended (``kill``, a CI runner's timeout) should end as Ctrl-C does, with its one line, instead
of dying mid-way. And a submission must not be cut between ``sbatch`` answering and the job being handed its run
dir: a signal that comes meanwhile is held and acts once the job is on record.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

__all__ = ["HELD", "composed", "held", "hold_while_composing", "interrupt", "sigterm_as_interrupt"]

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What ``held`` holds by default: the signals that end a command run from a shell."""


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that makes SIGTERM act as Ctrl-C."""
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt; the handler before it comes back after."""
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def held(signals: tuple[signal.Signals, ...] = HELD) -> Iterator[None]:
    """Hold ``signals`` over the block: one that comes meanwhile acts when the block ends, through the handler
    in place before it. Child processes started in the block hold them too (a terminal's Ctrl-C reaches its
    whole process group). Outside the main thread, where Python cannot set handlers, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    # The mask keeps the signals from this thread and its children; the handlers catch one another thread
    # takes (Python then runs the handler in the main thread, between two bytecodes).
    previous = {s: signal.signal(s, note) for s in signals}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


_COMPOSING = ExitStack()


def hold_while_composing() -> None:
    """Hold the signals that end a command (``held``) until ``composed``, while Hydra composes the config and
    OmegaConf turns it into ours: OmegaConf cut halfway through setting a node fails with an AttributeError of
    its own, which hides the Ctrl-C (a traceback and exit 1 instead of one line and 130; seen in CI)."""
    _COMPOSING.enter_context(held())


def composed() -> None:
    """The config is composed: a signal held meanwhile acts now (Ctrl-C and SIGTERM as KeyboardInterrupt)."""
    _COMPOSING.close()
