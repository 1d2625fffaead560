"""A small Python API for notebooks: submit configs, follow them, fetch their results.

    from hpc_train.api import submit
    runs = [submit("model=mlp", f"trainer.lr={lr}") for lr in (1e-3, 3e-3)]   # local, or add "cluster=slurm"
    results = [run.result() for run in runs]                                   # waits; raises if a run failed
    results[0]["final"]["val_acc"], results[0]["model_final"]

Every run is its own process tree (the same ``python -m hpc_train`` a shell would start), so a notebook can
train model after model: no process group, CUDA context or signal handler is left behind in the kernel.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from hpc_train.config import (
    CONFIG_MODULE,
    Config,
    check_overrides,
    config_from_dict,
    hydra_quoted,
    register_configs,
    slurm_alias_overrides,
)
from hpc_train.core.errors import ConfigError, LaunchError
from hpc_train.core.rundir import RunDir
from hpc_train.launch.preflight import check_paths
from hpc_train.launch.state import JobState, job_state

__all__ = ["Run", "compose_config", "submit"]

POLL_S = 1.0


def compose_config(*overrides: str, config_dir: str | Path | None = None) -> Config:
    """The validated config ``python -m hpc_train <overrides>`` would run; raises ConfigError. Its paths are
    checked against this machine's files, as a submission checks them (``check_paths``)."""
    # Hydra only when a config is composed
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(list(overrides), [Path(config_dir)] if config_dir else None)
    overrides = tuple(slurm_alias_overrides(list(overrides)))
    register_configs()
    extra = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    try:
        with initialize_config_module(config_module=CONFIG_MODULE.removeprefix("pkg://"), version_base="1.3"):
            raw = compose(config_name="config", overrides=[*overrides, *extra])
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    return check_paths(config_from_dict(raw, overrides))


@dataclass
class Run:
    """One submitted run: its directory and, while it lasts, the launching process."""

    run_dir: Path
    config: Config
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def _rd(self) -> RunDir:
        return RunDir(self.run_dir)

    def status(self) -> JobState:
        """The reconciled state (see ``python -m hpc_train.jobs status``)."""
        state = job_state(self._rd, self.config.cluster.world_size)
        if not state.done and self.process is not None and self.process.poll() not in (None, 0):
            launcher = self._rd.launcher_log
            return JobState(
                "FAILED", done=True, ok=False, detail=f"the launcher exited {self.process.returncode}; see {launcher}"
            )
        return state

    def wait(self, timeout: float | None = None) -> JobState:
        """Block until the run ends (or ``timeout`` seconds pass, then return the state as it is)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status()
            if state.done or (deadline is not None and time.monotonic() > deadline):
                return state
            time.sleep(POLL_S)

    def metrics(self) -> list[dict[str, Any]]:
        """All rows of metrics.jsonl so far."""
        return self._rd.read_metrics()

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait, then the outcome: final metrics, paths; raises LaunchError if the run did not complete."""
        state = self.wait(timeout)
        if not state.ok:
            raise LaunchError(f"run {self.run_dir} ended {state.state}: {state.detail}")
        final = self._rd.last_metrics()
        best = self._rd.model_best
        return {
            "state": state.state,
            "run_dir": self.run_dir,
            "final": final,
            "model_final": self._rd.model_final,
            "model_best": best if best.exists() else None,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights (after ``result()``)."""
        state: dict[str, torch.Tensor] = torch.load(self._rd.model_final, weights_only=True)
        return state


def submit(*overrides: str, run_dir: str | Path | None = None, config_dir: str | Path | None = None) -> Run:
    """Validate the config here, then start it as ``python -m hpc_train`` in its own process; returns at once.

    ``overrides`` are the command line's (``"cluster=slurm"``, ``"trainer.lr=3e-3"``); ``config_dir`` adds your
    own config folder (Hydra's --config-dir). The run directory defaults to ./outputs/<date>/<time>.
    """
    config = compose_config(*overrides, config_dir=config_dir)
    path = Path(run_dir) if run_dir else Path("outputs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S.%f")
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "hpc_train", *overrides, f"hydra.run.dir={hydra_quoted(str(path))}"]
    if config_dir:
        argv += ["--config-dir", str(Path(config_dir).resolve())]
    with RunDir(path).launcher_log.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Run(path, config, process)
