"""The commands a Slurm job runs: the supervisor in its batch step, srun and the worker in each training step.

Kept apart from the modules that run them, so that the launchers can write them into scripts without
importing the runtime itself.
"""

from __future__ import annotations

from hpc_train.config import ClusterConfig

__all__ = ["SUPERVISOR", "WORKER", "srun_argv"]

WORKER = "hpc_train.worker"
SUPERVISOR = "hpc_train.supervisor"


def srun_argv(cluster: ClusterConfig) -> list[str]:
    """srun and its options: one dead task ends the step, the others get ``srun_wait_s`` after the first exit."""
    return [
        "srun",
        "--kill-on-bad-exit=1",
        f"--wait={cluster.slurm.srun_wait_s}",
        "--unbuffered",
        *cluster.slurm.srun_args,
    ]
