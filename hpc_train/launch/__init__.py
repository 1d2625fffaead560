"""Launchers: take a validated Config and a run directory, start the ranks, report the outcome.

Launchers never import the trainer: every task runs ``hpc_train.worker``, which reads the run directory.
"""

from __future__ import annotations

from hpc_train.config import Config
from hpc_train.core.rundir import RunDir

__all__ = ["launch"]


def launch(cfg: Config, run_dir: RunDir) -> int:
    """Start the job with the launcher ``cfg.cluster.launcher`` names; returns the exit code for the CLI."""
    from hpc_train.launch.local import launch_debug, launch_local
    from hpc_train.launch.slurm import launch_slurm

    launchers = {"local": launch_local, "debug": launch_debug, "slurm": launch_slurm}
    return launchers[cfg.cluster.launcher](cfg, run_dir)
