"""``hydra/launcher=hpc_train``: a multirun sweep becomes one Slurm job array (cluster=slurm), or runs one job
after another here (cluster=local/debug). The work is done in ``hpc_train.launch.sweep``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class HpcTrainLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpc_train.launch.sweep import launch_sweep

        assert self.hydra_context is not None and self.task_function is not None and self.config is not None
        return launch_sweep(self.hydra_context, self.task_function, self.config, job_overrides, initial_job_idx)
