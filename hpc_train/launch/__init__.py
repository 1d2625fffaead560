"""Launchers: take a validated Config and a run directory, start the ranks, report the outcome.

Launchers never import the trainer: every task runs ``hpc_train.worker``, which reads the run directory that
``write_config`` prepared.

The names below live in ``hpc_train.launch.launcher`` and load on first use: a process that needs one launcher
module (the local launcher's watcher, ``hpc_train.launch.watcher``) does not pay for omegaconf, the config schema
and the trackers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_train.core.lazy import lazy_attributes

if TYPE_CHECKING:
    from hpc_train.launch.launcher import (
        claim_run_dir,
        finished_message,
        finished_step,
        launch,
        make_private,
        slurm_probe,
        write_config,
    )

__all__ = [
    "claim_run_dir",
    "finished_message",
    "finished_step",
    "launch",
    "make_private",
    "slurm_probe",
    "write_config",
]


__getattr__ = lazy_attributes(__name__, dict.fromkeys(__all__, "launcher"))
