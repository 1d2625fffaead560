"""Run a user's torchrun-style script on this rank (``script.path`` / ``script.module``).

The script gets the variables torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), resolved by hpc_train from Slurm or the
local launcher, so ``dist.init_process_group("nccl"|"gloo")`` with the default env:// works unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

from hpc_train.config import ClusterConfig, ScriptConfig
from hpc_train.dist import DistEnv

__all__ = ["run_script", "torchrun_environment"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def torchrun_environment(env: DistEnv, cluster: ClusterConfig, run_dir: str) -> dict[str, str]:
    """The variables a torchrun worker sees, for this rank."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "GROUP_RANK": str(env.node_rank),
        "ROLE_RANK": str(env.rank),
        "ROLE_WORLD_SIZE": str(env.world_size),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
        "OMP_NUM_THREADS": str(cluster.cpus_per_task),
        "HPC_TRAIN_RUN_DIR": run_dir,
    }


def run_script(script: ScriptConfig, env: DistEnv, cluster: ClusterConfig, run_dir: str) -> int:
    """Run the script as a child process with the torchrun environment; returns its exit code.

    Signals that reach this rank (Slurm's preemption signal, Ctrl-C, SIGTERM) are passed on to the script.
    """
    target = [script.path] if script.path else ["-m", script.module]
    child_env = {**os.environ, **torchrun_environment(env, cluster, run_dir)}
    child = subprocess.Popen([sys.executable, *target, *script.args], env=child_env)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
