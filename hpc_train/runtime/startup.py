"""Start-up, in one place: stop signals caught from the first line, the garbage collector during start-up, the
thread count, the device, and where the time went (``StartupProfile``)."""

from __future__ import annotations

import gc
import multiprocessing.process
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from hpc_train.config import Config
from hpc_train.core.records import StartupProfile
from hpc_train.distributed import DistEnv
from hpc_train.train.stopping import EARLY_STOP_SIGNALS, StopSignals

if TYPE_CHECKING:
    import torch

__all__ = ["Startup"]


class Startup:
    """A context for a rank's start-up: the cyclic garbage collector is off until ``done()``.

    Importing torch and torch._dynamo (which every torch optimizer pulls in) creates hundreds of thousands of
    objects; with the collector on, it walks them again and again while they are being made
    (docs/performance.md has what it costs). ``done()`` freezes what start-up made, so full collections during
    training no longer walk those long-lived objects either. The price: cyclic garbage made during start-up (from
    the imports; a user's dataset may add some) is kept, once; it does not grow. Collecting it first would cost
    a full collection before step 1.
    """

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"interpreter": time.time()}
        """When each phase of ``StartupProfile.PHASES`` ended (seconds since the epoch); the process's start is
        where the first began."""
        self._was_enabled = False
        self._done = False
        self._tempdir = ""
        self.signals = StopSignals(EARLY_STOP_SIGNALS)
        """Stop signals caught from the first line of the worker on: one that comes while torch is still being
        imported (Ctrl-C or a launcher's SIGTERM a second after launch) is kept for the trainer or the script,
        instead of being swallowed by submitit's handler or killing the rank before it can checkpoint."""

    def __enter__(self) -> Startup:
        self.signals.install()
        # A local launcher starts submitit's controller with SIGINT blocked, and the ranks inherit the block
        # (hpc_train.launch.local): lifted now that the handler is in place, a Ctrl-C that came meanwhile is kept.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        self._tempdir = _own_multiprocessing_tempdir()
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def mark(self, phase: str, at: float | None = None) -> None:
        """``phase`` (one of StartupProfile.PHASES) ends now, or ``at`` (seconds since the epoch); a phase marked
        again keeps its first end."""
        assert phase in StartupProfile.PHASES, phase
        self.marks.setdefault(phase, time.time() if at is None else at)

    def profile(self, rank: int, host: str) -> StartupProfile:
        """The phases marked so far, each from the end of the one before it that was marked."""
        seconds: dict[str, float] = {}
        before = process_started_at()
        for phase in StartupProfile.PHASES:
            end = self.marks.get(phase)
            if end is None:
                continue
            if before is not None:
                seconds[f"{phase}_s"] = round(max(0.0, end - before), 4)
            before = end
        return StartupProfile(rank=rank, host=host, **seconds)

    @property
    def stop_received(self) -> int:
        """The stop signal caught during start-up (0: none)."""
        return self.signals.received

    def done(self) -> None:
        """Start-up is over (the trainer is built): freeze its objects, collect again."""
        if not self._done:
            self._done = True
            gc.freeze()
            gc.enable()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.signals.restore()
        if self._tempdir:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            multiprocessing.process.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
        if self._was_enabled:  # cluster=debug runs the worker in the launcher's process
            gc.enable()

    @staticmethod
    def device(cfg: Config, env: DistEnv) -> torch.device:
        """Size torch's thread pool to the task's CPUs and pick this rank's device."""
        # torch here, after the rank's first status: its import is the start-up profile's "imports" phase
        import torch

        # The optimizer and DDP import it on their first use (~1 s on 2 busy cores): here, it counts as an import.
        import torch._dynamo

        # (process_group, with torch: imported with it, here)
        from hpc_train.distributed import auto_uses_cuda, select_device

        torch.set_num_threads(cfg.cluster.cpus_per_task)
        use_cuda = cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and auto_uses_cuda(env))
        return select_device(env, use_cuda)


def _own_multiprocessing_tempdir() -> str:
    """Give multiprocessing one temp folder for this rank and its DataLoader workers, to be removed when the
    rank ends ('' when one was set already).

    multiprocessing makes a ``/tmp/pymp-*`` folder per process that shares tensors (each DataLoader worker), and
    removes it only at a clean interpreter exit, which worker processes do not have: a run with
    data.num_workers=2 left 8 of them. Worker processes inherit the parent's setting, so with one set here they
    all use this folder. (multiprocessing keeps it in the process's ``_config``; ``util.get_temp_dir`` reads it.)
    """
    config = multiprocessing.process.current_process()._config  # type: ignore[attr-defined]
    if config.get("tempdir"):
        return ""
    config["tempdir"] = tempfile.mkdtemp(prefix="pymp-hpc_train-")
    return str(config["tempdir"])


def process_started_at() -> float | None:
    """When this process started, in seconds since the epoch (None without /proc): its start in clock ticks
    after boot (/proc/self/stat) set against the time since boot (/proc/uptime, to 10 ms; /proc/stat's boot
    time is in whole seconds)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
