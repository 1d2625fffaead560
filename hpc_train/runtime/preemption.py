"""For your own training loop under hpc_train: stop together on preemption, and know which attempt this is.

    import torch.distributed as dist
    from hpc_train import preemption

    dist.init_process_group("gloo")            # or nccl: your script sets up its own group, as under torchrun
    step = load_my_checkpoint()                # 0 on the first attempt
    while step < max_steps:
        train_one_step(); step += 1
        if preemption.should_stop(step):      # every rank calls it, every step
            save_my_checkpoint(step)           # on the ranks that take part in your checkpoint
            break                              # and return normally (exit 0): hpc_train requeues the job

Importing this module installs handlers for the stop signals (``cluster.signal``, SIGTERM, SIGINT) that only
set a flag; ``should_stop`` all-reduces that flag, so every rank sees True at the same step once any rank had
a signal. The reduction is asynchronous (the one started at a call is read at the next), so it costs about
nothing per step and the answer comes one step after the signal. Outside hpc_train (plain torchrun) it works
the same, with USR2, SIGTERM and SIGINT as the stop signals.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_train.core.batch import GLOBAL_BATCH_VARIABLE
from hpc_train.core.errors import ConfigError
from hpc_train.core.identity import JobIdentity
from hpc_train.core.nodes import NodeChannel
from hpc_train.core.rundir import RunDir
from hpc_train.train.stopping import StopSignals

__all__ = [
    "reclaim_signals",
    "restart_count",
    "should_stop",
    "stop_signal",
    "tracker_run_ids",
    "trackers_hold",
    "wait_for_all",
]

_DEFAULT_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def _stop_signals() -> list[int]:
    listed = os.environ.get("HPC_TRAIN_STOP_SIGNALS", "")
    return [int(s) for s in listed.split(",") if s] or [int(s) for s in _DEFAULT_SIGNALS]


_signals = StopSignals(_stop_signals()).install()
_job = JobIdentity.from_environ()
"""This script process's attempt, as its rank handed it over (HPC_TRAIN_ATTEMPT)."""
_control: Any = None
"""The group the flag is reduced over: the default group if it is gloo, else a gloo group made once."""
_agreed = 0
_first_step: int | None = None
_first_time = 0.0
_reported_at = 0.0
_batch_taken = False
"""The script asked ``hpc_train.global_batch.GlobalBatch`` for its batch (``note_global_batch``)."""
_steps_total: int | None = None
REPORT_EVERY_S = 1.0
"""How often the latest step is written for the goodput ledger (each write is one small file rename)."""


_TRACKER_VARIABLES = {"mlflow": "MLFLOW_RUN_ID", "wandb": "WANDB_RUN_ID"}
_tracker_ids = {tracker: os.environ[name] for tracker, name in _TRACKER_VARIABLES.items() if os.environ.get(name)}
"""Read at import: ``mlflow.start_run()`` removes MLFLOW_RUN_ID from the environment once it has used it."""


def tracker_run_ids() -> dict[str, str]:
    """The run dir's experiment tracker runs, for a hand-written loop that logs to them itself: ``{"mlflow":
    run id, "wandb": run id}`` for each tracker the config names (``tracking.*``). Every attempt gets the same
    ids: pass them to ``mlflow.start_run(run_id=...)`` or ``wandb.init(id=..., resume="allow")``, and log each
    step with its number. hpc_train gives a script the same ids as MLFLOW_RUN_ID and WANDB_RUN_ID, which
    ``mlflow.start_run()`` and ``wandb.init()`` read without any argument."""
    now = {tracker: os.environ[name] for tracker, name in _TRACKER_VARIABLES.items() if os.environ.get(name)}
    return _tracker_ids | now


def trackers_hold(step: int | None = None) -> int | None:
    """Rank 0 of a script with its own tracker code: with ``step``, record that the trackers now hold every row
    up to it; without, the latest step an earlier attempt recorded so (None: none, or no trackers). A resumed
    attempt that trains steps again after a crash need not log them again: the integrations' callbacks use it."""
    ids = set(tracker_run_ids().values())
    folder = os.environ.get("HPC_TRAIN_RUN_DIR")
    if not ids or not folder:
        return None
    rd = RunDir(Path(folder))
    runs = [r for r in rd.tracker_runs() if r.run_id in ids]
    if step is not None:
        for run in runs:
            if run.logged_step is None or run.logged_step < step:
                rd.write_tracker_run(replace(run, logged_step=step))
        return step
    steps = [r.logged_step for r in runs]
    return None if not steps or None in steps else min(s for s in steps if s is not None)


def restart_count() -> int:
    """0 on the first attempt; k after the job was restarted (requeued, resumed or restarted in its allocation)
    k times."""
    return _job.attempt


def stop_signal() -> int:
    """The stop signal the ranks agreed on (0 while there is none)."""
    return _agreed


def note_global_batch(steps: int | None) -> None:
    """``GlobalBatch.of`` was called: the script keeps ``script.global_batch``, and trains ``steps`` in all."""
    global _batch_taken, _steps_total
    _batch_taken, _steps_total = True, steps


def _check_global_batch() -> None:
    """A script run with ``script.global_batch`` must take its batch from ``GlobalBatch``: else, on another rank
    count than its own, it would train on another global batch without a word. Checked at its first step, every
    attempt, on any shape (a ConfigError: the job ends, not retried)."""
    given = os.environ.get(GLOBAL_BATCH_VARIABLE)
    if given and not _batch_taken:
        raise ConfigError(
            f"script.global_batch={given} says this script keeps that global batch on any node count, but it "
            f"reached its first step without asking hpc_train.global_batch.GlobalBatch.of for its share of it "
            f"({os.environ.get('WORLD_SIZE', '1')} ranks now). HINT: build the DataLoader from GlobalBatch.of(...)"
            ".per_rank and its sampler(...), or drop script.global_batch (and cluster.min_nodes)"
        )


def should_stop(step: int | None = None) -> bool:
    """True on every rank at the same call once any rank has had a stop signal; a collective over the group the
    script initialised, so every rank must call it, the same number of times.

    ``step`` (the optimizer steps done so far) lets hpc_train tell an attempt that made progress from one that
    did not, for ``cluster.slurm.max_stalled_restarts``; without it the requeue limit still counts restarts. Once
    True it stays True without another collective; a caller that saves at a later step than the one it was
    first told at (the Lightning callback, at an epoch's end) calls it again with that step.
    """
    global _agreed, _first_step, _first_time
    if step is not None and _first_step is None:
        _check_global_batch()
        _first_step, _first_time = step, time.time()
        _report(step, stopped=False)
    elif step is not None and time.monotonic() - _reported_at >= REPORT_EVERY_S:
        _report(step, stopped=False)
    if _agreed:  # a later call (a stop deferred to a later step) reports the step it stops at
        if step is not None:
            _report(step, stopped=True)
        return True
    _agreed = _signals.agree(_group()) if _initialized() else _signals.received
    if _agreed and step is not None:
        _report(step, stopped=True)
    return bool(_agreed)


def reclaim_signals() -> None:
    """Put the flag-only handlers back, for frameworks that install their own over them (Lightning does, at
    the start of every fit, with a SIGTERM handler that runs a collective inside the handler)."""
    _signals.install()


def wait_for_all() -> None:
    """A barrier over the control group (bounded by the process group's timeout); nothing without a group."""
    if _initialized():
        # torch only in a process that trains: this module is the API a script imports first
        import torch.distributed as dist

        dist.barrier(group=_group())


def _initialized() -> bool:
    # torch only in a process that trains: this module is the API a script imports first
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _group() -> Any:
    global _control
    # torch only in a process that trains: this module is the API a script imports first
    import torch.distributed as dist

    if _control is None:
        # Over gloo on the CPU: with NCCL the flag would make the host wait for the GPU at every step.
        _control = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return _control


def _report(step: int, stopped: bool) -> None:
    """Tell the worker which steps this attempt covered (it reads them after the script exits)."""
    global _reported_at
    run_dir, rank = os.environ.get("HPC_TRAIN_RUN_DIR"), os.environ.get("HPC_TRAIN_RANK", os.environ.get("RANK"))
    if not run_dir or rank is None:
        return
    _reported_at = time.monotonic()
    record = {
        "first_step": _first_step,
        "first_time": _first_time,
        "step": step,
        "time": time.time(),
        "stop_agreed": stopped,
        "attempt": restart_count(),
        "steps_total": _steps_total,
    }
    rd = RunDir(Path(run_dir))
    RunDir(rd.path, node=NodeChannel.from_environ(rd.path, rd.node_summary)).write_progress(int(rank), record)
