"""What lets a user see training, on rank 0: TensorBoard scalars, a profiler trace, GPU memory, plots."""

from __future__ import annotations

import logging
from typing import Any

import torch

from hpc_train.config import Config
from hpc_train.core.rundir import RunDir
from hpc_train.distributed import DistEnv
from hpc_train.train.plots import plot_run

__all__ = ["Observer"]

log = logging.getLogger(__name__)
PROFILE_WAIT, PROFILE_WARMUP = 1, 1


class Observer:
    """Everything here is off the hot path: created lazily, called at log rows, once per step for the profiler."""

    def __init__(self, cfg: Config, env: DistEnv, device: torch.device, run_dir: RunDir) -> None:
        self.tc, self.device, self.run_dir = cfg.trainer, device, run_dir
        self.main = env.is_main
        self._writer: Any = None
        self._profiler: torch.profiler.profile | None = None
        self._profiled = 0
        self._purge_step: int | None = None

    def start(self, step: int = 0) -> None:
        """Training starts from ``step`` (0, or the resumed checkpoint's)."""
        # TensorBoard: an earlier attempt's events past the checkpoint this one resumes from are dropped (its
        # reader purges, at a writer's start marker, every later event of the same folder), so each step shows
        # once, with the values of the attempt that kept it.
        folder = self.run_dir.tensorboard_run
        if self.main and folder.is_dir() and any(folder.glob("events.out.tfevents.*")):
            self._purge_step = step + 1
        if not (self.main and self.tc.profile_steps):
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=self.tc.profile_steps),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(self.run_dir.profile)),
            record_shapes=True,
        )
        self._profiler.start()

    def step(self) -> None:
        """Called after every optimizer step; stops the profiler once its steps are recorded."""
        if self._profiler is None:
            return
        self._profiler.step()
        self._profiled += 1
        if self._profiled >= PROFILE_WAIT + PROFILE_WARMUP + self.tc.profile_steps:
            self._profiler.stop()
            self._profiler = None
            log.info("profiler trace of %d steps written to %s", self.tc.profile_steps, self.run_dir.profile)

    def memory(self) -> dict[str, float]:
        """This rank's peak GPU memory so far (empty on CPU)."""
        if self.device.type != "cuda":
            return {}
        return {"cuda_max_mem_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}

    def scalars(self, row: dict[str, Any]) -> None:
        if not (self.main and self.tc.tensorboard):
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only once there is a row

            # Named after the run's overrides.
            self._writer = SummaryWriter(str(self.run_dir.tensorboard_run), purge_step=self._purge_step)
        for key, value in row.items():
            if key not in ("step", "epoch") and isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, row["step"])
        self._writer.flush()

    def close(self) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        # Nothing to draw before the first logged row (a stop during the first steps).
        if self.main and self.tc.plots and self.run_dir.metrics.exists() and self.run_dir.metrics.stat().st_size:
            try:
                paths = plot_run(self.run_dir.path)
                log.info("plots: %s", ", ".join(str(p) for p in paths))
            except Exception as exc:  # noqa: BLE001 - a plot must never hide the run's own outcome
                log.warning("could not plot %s: %s", self.run_dir.metrics, exc)
