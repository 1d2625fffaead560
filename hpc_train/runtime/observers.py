"""What the runtime watches of training (``StepObserver``s the worker composes and passes to the trainer):
the start-up profile, the watchdog's kick, the rank's heartbeat status, rank 0's goodput progress file and rank
0's trackers."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpc_train.core.records import Progress, StragglerReport
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState
from hpc_train.core.textutil import first_few
from hpc_train.tracking import TrackerLog
from hpc_train.train.hooks import BUILDING_MODEL, STARTING_FIT, StepObserver
from hpc_train.train.watchdog import Watchdog

if TYPE_CHECKING:
    from hpc_train.runtime.startup import Startup

__all__ = [
    "PROGRESS_EVERY_S",
    "Heartbeat",
    "Kicks",
    "ProgressFile",
    "StartupMarks",
    "StragglerLog",
    "TrackerRows",
]

PROGRESS_EVERY_S = 1.0
"""How often rank 0 writes its latest step for the goodput ledger (one small file rename)."""


class StartupMarks(StepObserver):
    """The trainer's part of the start-up profile (data ready, model built, first step); at the first step, the
    whole profile goes to the rank's log and, through its node, to the run dir (``jobs status``)."""

    MARKS: Mapping[str, str] = {BUILDING_MODEL: "data", STARTING_FIT: "model"}

    def __init__(self, startup: Startup, run_dir: RunDir, rank: int, host: str) -> None:
        self.startup, self.run_dir, self.rank, self.host = startup, run_dir, rank, host
        self._reported = False

    def on_phase(self, name: str) -> None:
        if name in self.MARKS:
            self.startup.mark(self.MARKS[name])

    def on_step(self, step: int) -> None:
        if self._reported:
            return
        self._reported = True
        self.startup.mark("first_step")
        profile = self.startup.profile(self.rank, self.host)
        logging.getLogger("hpc_train").info("%s", profile.describe())
        if self.run_dir.node is not None:
            self.run_dir.node.report_startup(profile)


class Kicks(StepObserver):
    """Every step, validation batch and checkpoint tells the watchdog that this rank still makes progress."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def on_step(self, step: int) -> None:
        self.watchdog.kick()

    def on_phase(self, name: str) -> None:
        self.watchdog.kick(name)


class Heartbeat(StepObserver):
    """The rank's status, rewritten at every metrics row with its step and peak memory (and the attempt's number,
    ``JobIdentity.attempt``)."""

    def __init__(self, run_dir: RunDir, rank: int, attempt: int | None = None) -> None:
        self.run_dir, self.rank, self.attempt = run_dir, rank, attempt

    def on_row(self, step: int, memory: Mapping[str, float]) -> None:
        self.run_dir.write_status(self.rank, RankState.RUNNING, attempt=self.attempt, step=step, **memory)


class ProgressFile(StepObserver):
    """Rank 0's steps in this attempt, with their times, for the goodput ledger (status/progress_0.json):
    written at the first step, then every PROGRESS_EVERY_S, and after each checkpoint and the final weights."""

    def __init__(self, run_dir: RunDir, rank: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.start_step = self.step = 0
        self.first_time = 0.0
        self._written_at = 0.0
        self._saved: tuple[int, float] | None = None
        self._slowest_save: float | None = None

    def on_start(self, step: int) -> None:
        self.start_step = self.step = step

    def on_step(self, step: int) -> None:
        self.step = step
        if not self.first_time:
            self.first_time = time.time()
            self._write()
        elif time.monotonic() - self._written_at >= PROGRESS_EVERY_S:
            self._write()

    def on_checkpoint_seconds(self, step: int, seconds: float) -> None:
        self._slowest_save = max(seconds, self._slowest_save or 0.0)  # written with on_saved's record, next

    def on_saved(self, step: int) -> None:
        self.step = step
        self._saved = (step, time.time())
        self._write()

    def _write(self) -> None:
        self._written_at = time.monotonic()
        saved_step, saved_time = self._saved if self._saved is not None else (None, None)
        record = Progress(
            first_step=self.start_step + 1,
            first_time=self.first_time,
            step=self.step,
            time=time.time(),
            checkpoint_step=saved_step,
            checkpoint_time=saved_time,
            checkpoint_s=None if self._slowest_save is None else round(self._slowest_save, 3),
        )
        self.run_dir.write_progress(self.rank, record)


class TrackerRows(StepObserver):
    """Rank 0's metrics rows, to the run dir's MLflow / W&B runs (``hpc_train.tracking.TrackerLog``), with the
    latest straggler figures (``StragglerReport.tracker_figures``) in the next row after each window."""

    def __init__(self, trackers: TrackerLog) -> None:
        self.trackers = trackers
        self._stragglers: dict[str, float] = {}

    def on_start(self, step: int) -> None:
        self.trackers.start(step)

    def on_stragglers(self, report: StragglerReport) -> None:
        self._stragglers = report.tracker_figures()

    def on_metrics(self, row: Mapping[str, Any]) -> None:
        figures, self._stragglers = self._stragglers, {}
        self.trackers.row({**row, **figures})


class StragglerLog(StepObserver):
    """Rank 0's straggler verdicts, to its log and ``status/stragglers.json``: a warning at every window while a
    rank is named (with the throughput the job loses to it), a line when it is no longer slow."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._named: dict[int, str] = {}

    def on_stragglers(self, report: StragglerReport) -> None:
        log = logging.getLogger("hpc_train")
        now = {r.rank: r.host for r in report.ranks}
        cleared = [
            f"rank {rank}{f' ({host})' if host else ''}" for rank, host in self._named.items() if rank not in now
        ]
        if cleared:  # one line, however many recovered at once (a rack at 1,000 nodes)
            log.info(
                "straggler%s cleared: %s %s no longer slow (step %s)",
                "s" if len(cleared) > 1 else "",
                first_few(cleared),
                "are" if len(cleared) > 1 else "is",
                report.step,
            )
        self._named = now
        if report.ranks:
            log.warning("%s", report.describe())
        try:
            self.run_dir.record_stragglers(report)
        except OSError as exc:  # a full run dir: the log has it
            log.warning("hpc_train: could not record the straggler verdict in %s: %s", self.run_dir.stragglers, exc)
