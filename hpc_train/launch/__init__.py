"""Launchers: take a validated Config and a run directory, start the ranks, report the outcome.

Launchers never import the trainer: every task runs ``hpc_train.worker``, which reads the run directory that
``write_config`` prepared.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from hpc_train.config import Config
from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write
from hpc_train.core.rundir import RunDir

__all__ = ["launch", "write_config"]


def write_config(cfg: Config, run_dir: RunDir) -> None:
    """Save the validated config; refuse to overwrite a different one (that run's record would be lost)."""
    text = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    if run_dir.config.exists() and run_dir.config.read_text() != text:
        raise ConfigError(
            f"hydra.run.dir={run_dir.path} already holds a run with a different {run_dir.config.name}. HINT: leave "
            "hydra.run.dir unset for a fresh directory, or pick a new one."
        )
    atomic_write(run_dir.config, lambda f: f.write(text.encode()))


def launch(cfg: Config, run_dir: RunDir) -> int:
    """Start the job with the launcher ``cfg.cluster.launcher`` names; returns the exit code for the CLI."""
    from hpc_train.launch.local import launch_debug, launch_local
    from hpc_train.launch.slurm import launch_slurm

    launchers = {"local": launch_local, "debug": launch_debug, "slurm": launch_slurm}
    return launchers[cfg.cluster.launcher](cfg, run_dir)
