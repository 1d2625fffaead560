"""Run a user's torchrun-style script on this rank (``script.path`` / ``script.module``).

The script gets the variables torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), resolved by hpc_train from Slurm or the
local launcher, so ``dist.init_process_group("nccl"|"gloo")`` with the default env:// works unchanged.

As under torchrun, the rendezvous store is not hosted by the script's rank 0 but by the launcher side (here:
the rank-0 worker, with TORCHELASTIC_USE_AGENT_STORE=True telling every script to connect as a client), and it
stays up until every rank's script has exited. With rank 0's script hosting it, a rank 0 that finishes first
takes the store down while the others are still tearing down their process groups, and they can abort
("terminate called without an active exception"). The script runs through ``hpc_train.runtime.script_boot``,
which also frees DDP's process group before the interpreter shuts down (the same abort, from torch itself).

How a rank's script run ends (the exit contract):
- no stop signal reached the rank and the script exited 0: completed;
- no stop signal, any other exit status: failed, with the tail of the script's stderr in the rank's status
  (so the launcher and ``hpc_train.jobs status`` show the script's own traceback, not ours);
- a stop signal (``cluster.signal``, SIGTERM or SIGINT) reached the rank: stopped, whatever the exit status.
  A script that uses ``hpc_train.preemption`` (or a callback from ``hpc_train.integrations``) saves and
  returns 0; a script that knows nothing of hpc_train dies of the signal. Either way the preemption signal
  requeues the job on Slurm, under the same limits as the built-in trainer, and the script resumes from what
  it saved.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import IO, Any

from hpc_train.config import ClusterConfig, Config, ScriptConfig
from hpc_train.core.errors import LaunchError, tag_step
from hpc_train.core.identity import ATTEMPT_VARIABLE, JobIdentity
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState
from hpc_train.distributed import DistEnv
from hpc_train.runtime.outcome import Fit
from hpc_train.train.stopping import StopSignals, signal_number

__all__ = ["ScriptError", "ScriptRun", "run_script", "run_user_script", "torchrun_environment"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
FINISHED_KEY = "hpc_train/scripts_finished"
log = logging.getLogger(__name__)


class ScriptError(LaunchError):
    """The user's script failed on this rank; ``detail`` is the tail of its stderr (its traceback)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True)
class ScriptRun:
    code: int
    """The script's exit status (negative: killed by that signal)."""
    stopped_by: int
    """The first stop signal that reached this rank while the script ran (0: none)."""
    stderr_tail: str


def torchrun_environment(env: DistEnv, cluster: ClusterConfig, run_dir: str, attempt: int = 0) -> dict[str, str]:
    """The variables a torchrun worker sees, for this rank, and the few ``hpc_train.preemption`` reads."""
    stop = [signal_number(cluster.signal), signal.SIGTERM, signal.SIGINT]
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
        ATTEMPT_VARIABLE: str(attempt),
        "HPC_TRAIN_STOP_SIGNALS": ",".join(str(int(s)) for s in stop),
    }


def script_argv(script: ScriptConfig) -> list[str]:
    """The command line of the script: a file or module through ``script_boot``, or a command as it is."""
    if script.command:
        return [script.command, *script.argv]
    target = [script.path] if script.path else ["-m", script.module]
    return [sys.executable, "-m", "hpc_train.runtime.script_boot", *target, *script.argv]


class _StderrTail:
    """Copies a child's stderr to ours as it comes, and keeps its end for the failure report."""

    KEEP = 16384

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe, self._kept = pipe, b""
        self._thread = threading.Thread(target=self._copy, name="script-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        fd = self._pipe.fileno()
        while chunk := os.read(fd, 65536):
            os.write(2, chunk)
            self._kept = (self._kept + chunk)[-self.KEEP :]

    def tail(self, lines: int = 15, wait_s: float = 5.0) -> str:
        """The last lines (a grandchild that holds the pipe open delays EOF: we wait ``wait_s`` at most)."""
        self._thread.join(wait_s)
        return "\n".join(self._kept.decode(errors="replace").splitlines()[-lines:])


def run_script(
    script: ScriptConfig,
    env: DistEnv,
    cluster: ClusterConfig,
    run_dir: str,
    timeout: timedelta,
    attempt: int = 0,
    early_stop: StopSignals | None = None,
) -> ScriptRun:
    """Run the script as a child process with the torchrun environment, until it exits.

    Signals that reach this rank (Slurm's preemption signal, Ctrl-C, SIGTERM) are passed on to the script;
    the first stop signal among them is remembered. ``early_stop``: the handlers of the rank's start-up; a
    signal they caught (up to the moment this one takes over, the store's connection included) is passed on
    as soon as the script runs.
    """
    import torch.distributed as dist

    # torch's stubs do not re-export TCPStore (it lives in torch._C).
    store = dist.TCPStore(  # type: ignore[attr-defined]
        env.master_addr, env.master_port, is_master=env.rank == 0, timeout=timeout, wait_for_workers=False
    )
    variables = torchrun_environment(env, cluster, run_dir, attempt)
    stops = {int(s) for s in variables["HPC_TRAIN_STOP_SIGNALS"].split(",")}
    child_env = {**os.environ, **variables, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    child = subprocess.Popen(script_argv(script), env=child_env, stderr=subprocess.PIPE)
    assert child.stderr is not None
    stderr = _StderrTail(child.stderr)
    stopped_by = 0

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped_by
        if signum == signal.SIGHUP:  # a hang-up is a stop: the script hears the SIGTERM it knows how to handle
            signum = signal.SIGTERM
        if signum in stops and not stopped_by:
            stopped_by = signum
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    if early_stop is not None and early_stop.received:
        forward(early_stop.received, None)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _finish(store, env, timeout)
    return ScriptRun(code, stopped_by, stderr.tail())


def run_user_script(
    rd: RunDir, env: DistEnv, cfg: Config, job: JobIdentity, early_stop: StopSignals | None = None
) -> Fit:
    """The user's torchrun-style script instead of the trainer; it sets up its own process group.

    Returns like the trainer does: completed, or stopped on a signal (with the steps the script reported
    through ``hpc_train.preemption``, if it did); raises ScriptError when it failed.
    """
    rd.write_status(env.rank, RankState.RUNNING, attempt=job.stamp, restart=job.attempt)
    rd.progress(env.rank).unlink(missing_ok=True)
    what = cfg.script.path or cfg.script.module or cfg.script.command
    log.info(
        "running %s on rank %d with the torchrun environment (master %s:%d)",
        what,
        env.rank,
        env.master_addr,
        env.master_port,
    )
    timeout = timedelta(seconds=cfg.trainer.dist_timeout_s)
    run = run_script(cfg.script, env, cfg.cluster, str(rd.path), timeout, job.attempt, early_stop)
    progress = rd.progress_record(env.rank)
    first, last = progress.first_step, progress.step
    start = None if first is None else first - 1
    if run.stopped_by:
        log.warning("%s ended with status %d after signal %d on rank %d", what, run.code, run.stopped_by, env.rank)
        return Fit(completed=False, start_step=start, step=last, signal=run.stopped_by)
    if run.code != 0:
        how = f"was killed by {signal.Signals(-run.code).name}" if run.code < 0 else f"exited with status {run.code}"
        last_line = next((line for line in reversed(run.stderr_tail.splitlines()) if line.strip()), "")
        error = ScriptError(
            f"{what} {how} on rank {env.rank}" + (f": {last_line.strip()}" if last_line else ""), run.stderr_tail
        )
        if last is not None:
            tag_step(error, last)  # the last step the script reported
        raise error
    return Fit(completed=True, start_step=start or 0, step=last or 0, signal=0)


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
