"""Rank 0's logging to the run dir's tracker runs, on a thread of its own: a slow or unreachable tracker costs
training nothing but one warning.

Every step once: each tracker run keeps the latest step it holds for certain (``TrackerRun.logged_step``), and
a resumed attempt skips the rows up to that step, which it trains again from its checkpoint. The exact resume
makes those rows the same numbers the tracker already holds, so skipping them loses nothing, and MLflow (which
would keep both) and W&B (which refuses a step below its latest, with a warning each time) each see one value
per step. Nothing missing: when an attempt opens a run, it first sends the rows of ``metrics.jsonl`` (the run
dir's own record, cut back to the checkpoint it resumes from) past that step: what an earlier attempt could not
deliver (the tracker was unreachable, or the rank was killed before W&B wrote them).

For certain: MLflow holds a row once the server has answered; W&B only once ``finish`` returns (its service
process writes, and a killed rank takes the unwritten rows with it), so a W&B run's step is kept at the end of
an attempt. Each attempt also asks the store for the latest step it holds, which may be past ``logged_step``
(an attempt that ended while rows were on their way): MLflow's server, and W&B's offline folders
(``wandb_files``).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Literal

from hpc_train.config import Config
from hpc_train.core.records import AttemptOutcome, TrackerRun
from hpc_train.core.rundir import RunDir
from hpc_train.tracking.runs import ensure_runs, flat_config, mlflow_patience
from hpc_train.tracking.wandb_files import offline_step

__all__ = ["TrackerLog", "attempt_note", "row_values"]

log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = {"completed": 30.0, "stopped": 10.0, "failed": 10.0}
"""How long the end of an attempt waits for the rows still queued: less after a stop signal, whose grace is
short, or a failure."""


def row_values(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row, as trackers take them: the step aside, and no flags (``early_stop``)."""
    return {
        key: float(value)
        for key, value in row.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def attempt_note(run_dir: RunDir, attempt: int, resumed_from: int) -> str:
    """What an attempt is, in words for the tracker: which one, from which step, and after what."""
    after = ""
    attempts = [a for a in run_dir.attempt_records() if a.attempt < attempt]
    requeues = [r for r in run_dir.requeue_records() if r.attempt < attempt]
    if attempts and attempts[-1].outcome is not AttemptOutcome.RUNNING:
        last = attempts[-1]
        why = f" ({last.failure.kind})" if last.failure is not None else ""
        after = f" after attempt {last.attempt} {last.outcome}{why}"
    elif requeues:
        after = f" after a stop on signal {requeues[-1].signal} at step {requeues[-1].stopped_step}"
    elif attempt > 0:
        after = " after a relaunch of the run dir"
    start = f"resumed from step {resumed_from}" if resumed_from else "from step 0"
    return f"attempt {attempt}: {start}{after}"


class _Backend:
    """One tracker run, from the logging thread."""

    name = ""
    durable = True
    """A row is the tracker's for certain once ``log`` returns (else: once ``finish`` does)."""

    def __init__(self, run: TrackerRun) -> None:
        self.run = run
        self.sent = run.logged_step
        """The latest step sent in this attempt (or held from an earlier one)."""

    def open(self, attempt: int, note: str, params: Mapping[str, str]) -> None:
        raise NotImplementedError

    def log(self, step: int, values: Mapping[str, float]) -> None:
        raise NotImplementedError

    def finish(self, outcome: str) -> None:
        raise NotImplementedError


class _Mlflow(_Backend):
    name = "MLflow"
    _STATUS: ClassVar[Mapping[str, str]] = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}

    def open(self, attempt: int, note: str, params: Mapping[str, str]) -> None:
        # the tracker package (an optional extra) only when it is configured
        from mlflow.entities import RunTag
        from mlflow.tracking import MlflowClient

        mlflow_patience()  # for every request of this rank-0 process, which runs no tracker code of the user's
        self.client = MlflowClient(tracking_uri=self.run.store)
        self.sent = self._held(self.sent)
        self.client.update_run(self.run.run_id, status="RUNNING")
        tags = [RunTag("hpc_train.attempt", str(attempt)), RunTag(f"hpc_train.attempt.{attempt}", note)]
        self.client.log_batch(self.run.run_id, tags=tags)

    def _held(self, recorded: int | None) -> int | None:
        """The latest step the run holds, as the server says: an attempt that ended while a row was on its way
        (its end waits a bounded time for the queue) leaves the row in MLflow and ``logged_step`` one row behind,
        and sending that row again would log its step twice."""
        metrics = self.client.get_run(self.run.run_id).data.metrics
        steps = [m.step for key in metrics for m in self.client.get_metric_history(self.run.run_id, key)]
        return max([*steps, recorded or 0]) or None

    def log(self, step: int, values: Mapping[str, float]) -> None:
        # the tracker package (an optional extra) only when it is configured
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run.run_id, metrics=metrics)

    def finish(self, outcome: str) -> None:
        self.client.set_terminated(self.run.run_id, status=self._STATUS.get(outcome, "FAILED"))


class _Wandb(_Backend):
    name = "W&B"
    durable = False

    def __init__(self, run: TrackerRun, cfg: Config, run_dir: RunDir) -> None:
        super().__init__(run)
        self.cfg, self.run_dir = cfg, run_dir

    def open(self, attempt: int, note: str, params: Mapping[str, str]) -> None:
        # the tracker package (an optional extra) only when it is configured
        import wandb

        wc = self.cfg.tracking.wandb
        mode: Literal["online", "offline"] = "offline" if wc.mode == "offline" else "online"
        if mode == "offline":
            self.sent = self._held(self.sent)
        label = " ".join(self.run_dir.label_overrides()) or self.run_dir.path.name
        self.handle = wandb.init(
            project=wc.project,
            entity=wc.entity or None,
            id=self.run.run_id,
            resume="allow",
            mode=mode,
            dir=str(self.run_dir.path),
            name=label[:128],
            config=dict(params),
            settings=wandb.Settings(console="off", silent=True),
        )
        self.handle.config.update(
            {"hpc_train.run_dir": str(self.run_dir.path.resolve()), f"hpc_train.attempt.{attempt}": note},
            allow_val_change=True,
        )
        self.handle.summary["hpc_train.attempt"] = attempt

    def _held(self, recorded: int | None) -> int | None:
        """The latest step the run's offline folders hold (they are its store until ``wandb sync``): an attempt
        killed, or whose ``finish`` outlasted its end, leaves rows there and ``logged_step`` behind them. Online,
        W&B's server drops a step below its latest itself."""
        try:
            held = offline_step(self.run_dir.path, self.run.run_id)
        except (OSError, ValueError, ImportError) as exc:  # W&B's own format: an unknown one is a warning
            log.warning("hpc_train: the earlier W&B offline rows of %s could not be read: %s", self.run.run_id, exc)
            return recorded
        return max(held or 0, recorded or 0) or None

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.handle.log(dict(values), step=step)

    def finish(self, outcome: str) -> None:
        self.handle.finish(exit_code=0 if outcome in ("completed", "stopped") else 1)


class TrackerLog:
    """Rank 0's rows, sent to every tracker the config names, in order, by one thread."""

    def __init__(self, run_dir: RunDir, cfg: Config, attempt: int) -> None:
        self.run_dir, self.cfg, self.attempt = run_dir, cfg, attempt
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._backends: list[_Backend] = []
        self._thread = threading.Thread(target=self._serve, name="hpc_train-trackers", daemon=True)

    def start(self, step: int) -> None:
        """Training starts from ``step``: open the runs (created now if the launcher could not)."""
        self._thread.start()
        self._tasks.put(lambda: self._open(step))

    def row(self, row: Mapping[str, Any]) -> None:
        step, values = int(row["step"]), row_values(row)
        self._tasks.put(lambda: self._log(step, values))

    def close(self, outcome: str) -> None:
        """Finish the runs (``outcome``: completed, stopped or failed), waiting a bounded time for the rows still
        queued (``CLOSE_TIMEOUT_S``)."""
        if not self._thread.is_alive():
            return
        timeout = CLOSE_TIMEOUT_S[outcome]
        self._tasks.put(lambda: self._finish(outcome))
        self._tasks.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "hpc_train: the trackers did not take the last rows within %.0f s; they are not all logged", timeout
            )

    # ---- on the logging thread -----------------------------------------------------------------------------

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except Exception as exc:  # noqa: BLE001 - the run dir's record (a full disk?): warn, go on
                log.warning("hpc_train: tracker bookkeeping failed: %s", exc)

    def _open(self, step: int) -> None:
        try:
            runs = ensure_runs(self.run_dir, self.cfg)
            params = flat_config(self.cfg)
        except Exception as exc:  # noqa: BLE001 - a tracker never ends training
            log.warning("hpc_train: the trackers are off for this attempt: %s", exc)
            return
        note = attempt_note(self.run_dir, self.attempt, step)
        kept = [row for row in self.run_dir.read_metrics() if int(row["step"]) <= step]
        for run in runs:
            backend = _Mlflow(run) if run.tracker == "mlflow" else _Wandb(run, self.cfg, self.run_dir)
            if self._guarded(backend, functools.partial(backend.open, self.attempt, note, params)):
                self._backends.append(backend)
                where = run.store if run.tracker == "mlflow" else run.store.lstrip("/")
                log.info("hpc_train: logging to %s run %s (%s), %s", backend.name, run.run_id, where, note)
                missing = [row for row in kept if backend.sent is None or int(row["step"]) > backend.sent]
                if missing:
                    log.info("hpc_train: %d earlier row(s) sent to %s now", len(missing), backend.name)
                for row in missing:
                    self._send(backend, int(row["step"]), row_values(row))

    def _log(self, step: int, values: Mapping[str, float]) -> None:
        for backend in list(self._backends):
            self._send(backend, step, values)

    def _send(self, backend: _Backend, step: int, values: Mapping[str, float]) -> None:
        if backend.sent is not None and step <= backend.sent:
            return  # the tracker has it: an earlier attempt's row, the same numbers (exact resume)
        if self._guarded(backend, functools.partial(backend.log, step, values)):
            backend.sent = step
            if backend.durable:
                self._keep(backend)

    def _keep(self, backend: _Backend) -> None:
        """Record the step the tracker now holds for certain."""
        backend.run = replace(backend.run, logged_step=backend.sent)
        self.run_dir.write_tracker_run(backend.run)

    def _finish(self, outcome: str) -> None:
        for backend in list(self._backends):
            if self._guarded(backend, functools.partial(backend.finish, outcome)) and not backend.durable:
                self._keep(backend)
        self._backends.clear()

    def _guarded(self, backend: _Backend, call: Callable[[], None]) -> bool:
        """Run ``call``; a failure turns the tracker off for the rest of the attempt, with one warning."""
        try:
            call()
            return True
        except Exception as exc:  # noqa: BLE001 - a tracker never ends training
            log.warning("hpc_train: %s is off for the rest of this attempt: %s", backend.name, exc)
            if backend in self._backends:
                self._backends.remove(backend)
            return False
