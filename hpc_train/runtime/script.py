"""Run a user's torchrun-style script on this rank (``script.path`` / ``script.module``).

The script gets the variables torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), resolved by hpc_train from Slurm or the
local launcher, so ``dist.init_process_group("nccl"|"gloo")`` with the default env:// works unchanged.

As under torchrun, the rendezvous store is not hosted by the script's rank 0 but by the launcher side (here:
the rank-0 worker, with TORCHELASTIC_USE_AGENT_STORE=True telling every script to connect as a client), and it
stays up until every rank's script has exited. With rank 0's script hosting it, a rank 0 that finishes first
takes the store down while the others are still tearing down their process groups, and they can abort
("terminate called without an active exception"). The script runs through ``hpc_train.script_boot``, which
also frees DDP's process group before the interpreter shuts down (the same abort, from torch itself).

The script's exit code is the rank's verdict: 0 completed, anything else failed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from types import FrameType
from typing import Any

from hpc_train.config import ClusterConfig, Config, ScriptConfig
from hpc_train.core.errors import LaunchError
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState
from hpc_train.dist import DistEnv
from hpc_train.runtime.outcome import Outcome

__all__ = ["run_script", "run_user_script", "torchrun_environment"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
FINISHED_KEY = "hpc_train/scripts_finished"
log = logging.getLogger(__name__)


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


def run_script(script: ScriptConfig, env: DistEnv, cluster: ClusterConfig, run_dir: str, timeout: timedelta) -> int:
    """Run the script as a child process with the torchrun environment; returns its exit code.

    Signals that reach this rank (Slurm's preemption signal, Ctrl-C, SIGTERM) are passed on to the script.
    """
    import torch.distributed as dist

    # torch's stubs do not re-export TCPStore (it lives in torch._C).
    store = dist.TCPStore(  # type: ignore[attr-defined]
        env.master_addr, env.master_port, is_master=env.rank == 0, timeout=timeout, wait_for_workers=False
    )
    target = ["-m", "hpc_train.runtime.script_boot", *([script.path] if script.path else ["-m", script.module])]
    child_env = {**os.environ, **torchrun_environment(env, cluster, run_dir), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    child = subprocess.Popen([sys.executable, *target, *script.args], env=child_env)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _finish(store, env, timeout)
    return code


def run_user_script(rd: RunDir, env: DistEnv, cfg: Config) -> Outcome:
    """The user's torchrun-style script instead of the trainer; it sets up its own process group."""
    rd.write_status(env.rank, RankState.RUNNING)
    what = cfg.script.path or cfg.script.module
    log.info(
        "running %s on rank %d with the torchrun environment (master %s:%d)",
        what,
        env.rank,
        env.master_addr,
        env.master_port,
    )
    code = run_script(cfg.script, env, cfg.cluster, str(rd.path), timedelta(seconds=cfg.trainer.dist_timeout_s))
    if code != 0:
        raise LaunchError(f"{what} exited with status {code} on rank {env.rank}")
    return Outcome(RankState.COMPLETED, 0)


def _finish(store: Any, env: DistEnv, timeout: timedelta) -> None:
    """Count this rank out; rank 0 keeps the store up until every rank has (bounded by ``timeout``)."""
    try:
        finished = store.add(FINISHED_KEY, 1)
        deadline = time.monotonic() + timeout.total_seconds()
        while env.rank == 0 and finished < env.world_size and time.monotonic() < deadline:
            time.sleep(0.1)
            finished = store.add(FINISHED_KEY, 0)
    except RuntimeError as exc:  # the store went away: a peer failed, which the launcher reports
        log.warning("rank %d could not report its script's end to the store: %s", env.rank, exc)
