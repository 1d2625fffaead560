"""Stragglers in a user's script, with no change to the script (``cluster.stragglers``).

``script_boot`` calls ``install`` before the script runs, when its worker asked for it (WINDOW_VARIABLE): the
first ``DistributedDataParallel`` the script builds (by hand, or inside the Hugging Face Trainer, Lightning or
Accelerate) gets a ``ComputeClock`` on the model it wraps, and a thread reports the rank's own compute time
every window through its node (``NodeChannel.report_compute``: node-local, no collective, no file of its own in
the run dir). Rank 0's worker compares the ranks from the nodes' summaries (``judge_from_summaries``).

Rank 0's worker leaves its newest verdict in its node's folder (``NodeChannel.publish_stragglers``), where rank 0
of the script reads it (``TrackerFigures``): the integrations' callbacks log its figures into the script's own
trackers (Lightning's loggers; the Hugging Face Trainer's MLflow and W&B runs, ``log_to_active_trackers``).

What it does not reach: a model that is not wrapped in torch's DDP (FSDP, DeepSpeed, a framework's own
all-reduce), a script started as a command (``script.command``: no ``script_boot``), and the gap between
windows (a rank's figure is its own window's, not aligned with the others' as the built-in trainer's are).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from hpc_train.core.nodes import NODE_DIR_VARIABLE, NodeChannel
from hpc_train.core.records import NodeSummary, RankCompute, StragglerReport
from hpc_train.core.rundir import RunDir

__all__ = ["WINDOW_VARIABLE", "TrackerFigures", "install", "judge_from_summaries", "log_to_active_trackers"]

log = logging.getLogger(__name__)

WINDOW_VARIABLE = "HPC_TRAIN_STRAGGLER_WINDOW_S"
"""Set by the worker (cluster.stragglers.window_s) when the script's ranks should time themselves."""
DDP_MODULE = "torch.nn.parallel.distributed"


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Time the first DDP model the script builds, if the worker asked and the node channel is there."""
    environ = os.environ if environ is None else environ
    window = float(environ.get(WINDOW_VARIABLE) or 0)
    rank, run_dir = environ.get("RANK"), environ.get("HPC_TRAIN_RUN_DIR")
    if window <= 0 or not environ.get(NODE_DIR_VARIABLE) or rank is None or not run_dir:
        return False
    if DDP_MODULE in sys.modules:  # imported already (cluster=debug runs the script in the worker's process)
        _patch(sys.modules[DDP_MODULE], window, int(rank), Path(run_dir))
        return True
    sys.meta_path.insert(0, _AfterImport(DDP_MODULE, lambda m: _patch(m, window, int(rank), Path(run_dir))))
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``name`` has been imported (the first time), without importing it itself."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            self.then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_attached = threading.Event()


def _patch(module: ModuleType, window_s: float, rank: int, run_dir: Path) -> None:
    ddp = module.DistributedDataParallel
    original = ddp.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not _attached.is_set():  # the first model only: a second (a teacher, an EMA copy) is not the one trained
            _attached.set()
            _start(self.module, window_s, rank, run_dir)

    ddp.__init__ = init


def _start(model: Any, window_s: float, rank: int, run_dir: Path) -> None:
    # torch: the script has imported it by the time its model is wrapped
    from hpc_train.distributed.stragglers import ComputeClock, device_name

    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else None
    clock = ComputeClock(model, device)
    channel = NodeChannel.from_environ(run_dir, RunDir(run_dir).node_summary)
    name = device_name(device, os.environ.get("CUDA_VISIBLE_DEVICES", "")) if device is not None else ""

    def report() -> None:
        while True:
            time.sleep(window_s)
            seconds, intervals = clock.take()
            if intervals and channel is not None:
                record = RankCompute(
                    rank=rank, time=time.time(), per_interval_s=seconds / intervals, intervals=intervals, device=name
                )
                try:
                    channel.report_compute(record)
                except OSError:  # the node's folder is gone (the rank is ending): nothing more to report
                    return

    threading.Thread(target=report, name="hpc_train-stragglers", daemon=True).start()


def judge_from_summaries(
    summaries: Sequence[NodeSummary], judge: Any, now: float, window_s: float, step: int | None = None
) -> StragglerReport | None:
    """Rank 0's worker, every window: the verdict of ``judge`` (a ``StragglerJudge``) over each rank's newest
    figure no older than two ``window_s`` (the caller's window, or the summaries' period when that is longer),
    with its node's host; None when no figure is newer than the last judged."""
    # torch: the script has imported it by the time its model is wrapped
    from hpc_train.distributed.stragglers import RankWindow

    newest: dict[int, tuple[RankCompute, str]] = {}
    for summary in summaries:
        for record in summary.compute:
            if now - record.time <= 2 * window_s and (
                record.rank not in newest or record.time > newest[record.rank][0].time
            ):
                newest[record.rank] = (record, summary.host)
    latest = max((r.time for r, _ in newest.values()), default=None)
    if latest is None or latest <= judge.judged_until:
        return None
    judge.judged_until = latest
    figures = [RankWindow(r.rank, r.per_interval_s, host, r.device) for r, host in newest.values()]
    report: StragglerReport = judge.judge(sorted(figures, key=lambda f: f.rank), step, now)
    return report


class TrackerFigures:
    """Rank 0 of a user's script: the tracker figures (``StragglerReport.tracker_figures``) of each new verdict of
    its worker, read from the node's folder at most once every ``CHECK_S``. Nothing on other ranks, without a
    node channel, or with stragglers off."""

    CHECK_S = 1.0

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        run_dir = environ.get("HPC_TRAIN_RUN_DIR")
        wanted = environ.get("RANK") == "0" and float(environ.get(WINDOW_VARIABLE) or 0) > 0 and bool(run_dir)
        self._channel = (
            NodeChannel.from_environ(Path(str(run_dir)), RunDir(Path(str(run_dir))).node_summary, environ)
            if wanted
            else None
        )
        self._checked = float("-inf")
        self._seen = 0.0

    def new(self) -> dict[str, float]:
        """The figures of a verdict newer than the last one returned; {} when there is none (or it was checked
        less than ``CHECK_S`` ago)."""
        now = time.monotonic()
        if self._channel is None or now - self._checked < self.CHECK_S:
            return {}
        self._checked = now
        report = self._channel.stragglers()
        if report is None or report.time <= self._seen:
            return {}
        self._seen = report.time
        return report.tracker_figures()


_warned: set[str] = set()


def log_to_active_trackers(figures: Mapping[str, float], step: int) -> list[str]:
    """Log ``figures`` into the trackers the script has open in this thread: MLflow's active run (at ``step``) and
    W&B's run (into its next row: ``commit=False``). Only those the script imported; a failure is one warning per
    tracker. The names of the trackers that took them."""
    took = []
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and hasattr(mlflow, "active_run"):
        try:
            if mlflow.active_run() is not None:
                mlflow.log_metrics(dict(figures), step=step)
                took.append("mlflow")
        except Exception as exc:  # noqa: BLE001 - a tracker never ends training
            _warn_once("mlflow", exc)
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is not None:
        try:
            run.log(dict(figures), commit=False)
            took.append("wandb")
        except Exception as exc:  # noqa: BLE001
            _warn_once("wandb", exc)
    return took


def _warn_once(tracker: str, exc: Exception) -> None:
    if tracker not in _warned:
        _warned.add(tracker)
        log.warning("hpc_train: the straggler figures could not go to %s: %s", tracker, exc)
