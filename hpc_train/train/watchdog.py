"""Hang watchdog: when no step completes for ``timeout_s``, dump every thread's stack and exit non-zero.

A rank stuck in a collective whose peer froze (SIGSTOP, a deadlock, a dead NFS mount) never exits by itself,
and Slurm's ``--kill-on-bad-exit`` only fires once some task exits. A daemon thread watches the time of the
last ``kick()`` (the trainer kicks after each step and while validating or checkpointing). When it is too
old, the thread writes all Python stacks into the rank's log with faulthandler, calls ``on_fire`` (which
records the failure) and ends the process with EXIT_CODE, so srun or the local launcher tears the job down.

The thread needs the GIL to run. In case C code holds it forever, the thread also keeps re-arming
``faulthandler.dump_traceback_later`` a little beyond the deadline: if the thread cannot run, faulthandler's
own C thread dumps the stacks and exits.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import IO

from hpc_train.core.errors import ExitCode

__all__ = ["EXIT_CODE", "FROZEN", "Watchdog"]

EXIT_CODE = ExitCode.HUNG
FROZEN = "This rank was itself not running"
"""In the watchdog's report of a rank that was frozen: the supervisor blames its node."""
log = logging.getLogger(__name__)


class Watchdog:
    def __init__(self, timeout_s: float, stream: IO[str], on_fire: Callable[[str], None]) -> None:
        self.timeout_s, self.stream, self.on_fire = timeout_s, stream, on_fire
        self.what = "starting"
        self._last = time.monotonic()
        self.paused_s = 0.0
        """The longest time this process did not run at all, as the watchdog's own late ticks show."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpc_train-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def kick(self, what: str = "training") -> None:
        """Progress: the clock starts again. Cheap (two assignments): called after every step."""
        self._last = time.monotonic()
        self.what = what

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        faulthandler.cancel_dump_traceback_later()

    @property
    def _tick(self) -> float:
        return min(1.0, self.timeout_s / 4)

    def _run(self) -> None:
        tick = self._tick
        woke = time.monotonic()
        while not self._stop.wait(tick):
            now = time.monotonic()
            # A tick that came far too late: this process itself did not run (SIGSTOP, a frozen node, swap).
            self.paused_s = max(self.paused_s, now - woke - tick)
            woke = now
            idle = now - self._last
            if idle <= self.timeout_s:
                # The backstop fires only if this thread stops running (re-armed each tick).
                faulthandler.dump_traceback_later(self.timeout_s - idle + 4 * tick + 5, exit=True, file=self.stream)
                continue
            self._fire(idle)

    def _fire(self, idle: float) -> None:
        faulthandler.cancel_dump_traceback_later()
        message = (
            f"watchdog: no progress for {idle:.0f}s (trainer.watchdog_s={self.timeout_s:g}) while {self.what}; "
            "stacks of all threads follow, then this rank exits"
        )
        if self.paused_s > self.timeout_s / 2:
            message += f". {FROZEN} for {self.paused_s:.0f}s (stopped, or starved of CPU): it is the likely cause"
        log.error("%s", message)
        self.stream.write(f"--- {message} ---\n")
        self.stream.flush()
        faulthandler.dump_traceback(file=self.stream, all_threads=True)
        self.stream.flush()
        try:
            self.on_fire(message)
            # The other ranks, blocked in a collective since the same step, fire within a tick: wait for them to
            # write their stacks too, before this exit makes srun kill them.
            time.sleep(3 * self._tick)
        finally:
            os._exit(EXIT_CODE)
