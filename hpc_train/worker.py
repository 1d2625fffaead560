"""What every task runs: resolve the environment, init the process group, build the Trainer, fit, close.

Launched by submitit (``run``), by an sbatch script or by hand: ``[srun|torchrun ...] python -m hpc_train.worker
--run-dir RUN_DIR``. The run directory's ``config.yaml`` is the whole input, so a task needs no pickle.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from hpc_train.config import Config
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState
from hpc_train.dist import DistEnv, detect_source, resolve_environment
from hpc_train.faults import fault_from_env
from hpc_train.requeue import record_attempt, refusal, requeue, requeue_target
from hpc_train.train.stopping import signal_number

__all__ = ["main", "run"]

log = logging.getLogger("hpc_train")


def run(run_dir: str | Path) -> None:
    """Train the job described by ``<run_dir>/config.yaml`` as this process's rank."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # until the trainer is built: see _startup_done
    rd = RunDir(Path(run_dir))
    env = resolve_environment()
    restart = rd.attempt()
    rd.write_status(
        env.rank, RankState.STARTING, restart=restart
    )  # before the slow imports: the launcher watches this pid
    try:
        _setup_logging(rd, env, restart)
        outcome = _train(rd, env, restart)
    except BaseException as exc:
        rd.write_failure(env.rank, exc)
        raise
    finally:
        if gc_was_enabled:  # cluster=debug runs this in the launcher's process
            gc.enable()
    rd.write_status(env.rank, outcome.state, step=outcome.step, restart=restart, **outcome.extra)


@dataclass(frozen=True)
class Outcome:
    state: RankState
    """completed, or stopped (checkpointed on a signal; requeued on Slurm)."""
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


def _train(rd: RunDir, env: DistEnv, restart: int) -> Outcome:
    import torch

    from hpc_train.config import load_config
    from hpc_train.dist import auto_uses_cuda, distributed, format_rank_table, gather_rank_table, select_device
    from hpc_train.train.stopping import StopSignals
    from hpc_train.train.trainer import COMPLETED, Trainer
    from hpc_train.train.watchdog import Watchdog

    cfg = load_config(rd.config)
    if cfg.script.enabled:
        _startup_done()
        _run_script(rd, env, cfg)
        return Outcome(RankState.COMPLETED, 0)
    torch.set_num_threads(cfg.cluster.cpus_per_task)
    use_cuda = cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and auto_uses_cuda(env))
    device = select_device(env, use_cuda)
    fault = fault_from_env()
    if fault is not None:
        fault.maybe_fire(env.rank, step=0)  # step 0: before the rendezvous, where a lost rank hurts most
    tc = cfg.trainer
    # Installed before the rendezvous: a signal that comes during start-up is kept and acted on after step 1.
    stop = StopSignals([signal_number(cfg.cluster.signal), signal.SIGTERM, signal.SIGINT]).install()
    stream = rd.rank_log(env.rank, restart).open("a")
    watchdog = Watchdog(tc.watchdog_s, stream, lambda why: _watchdog_fired(rd, env, why)).start()
    timeouts = timedelta(seconds=tc.dist_timeout_s), timedelta(seconds=tc.preflight_timeout_s)
    try:
        with distributed(env, device, *timeouts):
            rows = gather_rank_table(env, device)
            if env.is_main:
                log.info("rank table (%d ranks):\n%s", len(rows), format_rank_table(rows))
                rd.write_rank_table([row.as_dict() for row in rows])
            rd.write_status(env.rank, RankState.RUNNING, restart=restart)
            trainer = Trainer(cfg, env, device, rd, stop=stop, watchdog=watchdog)
            _startup_done()
            try:
                result = trainer.fit()
                start_step, step, signum = trainer.start_step, trainer.step, trainer.stopped_by
                peak = trainer.observer.memory()  # the final status keeps the peak GPU memory the heartbeats had
            finally:
                trainer.close()
                # Release DDP and its pending gloo/NCCL work before the process group goes: work objects still
                # holding tensors when the interpreter shuts down can abort the process (pytorch PR #179291).
                del trainer
                gc.collect()
    finally:
        watchdog.stop()
        stop.restore()
        stream.close()
    if result == COMPLETED:
        return Outcome(RankState.COMPLETED, step, peak)
    return _after_stop(rd, env, cfg, restart, start_step, step, signum, peak)


def _startup_done() -> None:
    """Turn the cyclic garbage collector back on, minus the objects start-up made.

    Importing torch and torch._dynamo (which the optimizer and DDP pull in) creates ~280k objects; with the
    collector on, it walks them again and again while they are being made. Off during start-up, each rank
    reached its first step about 0.4 s sooner on a 2-core node. Freezing moves those long-lived objects out of
    the collector's view, so full collections during training no longer walk them either. The price: cyclic
    garbage made during start-up (about 10k objects from the imports; a user's dataset may add some) is kept,
    once; it does not grow. Collecting it first would cost a full collection (~0.1-0.2 s) before step 1.
    """
    gc.freeze()
    gc.enable()


def _after_stop(
    rd: RunDir, env: DistEnv, cfg: Config, restart: int, start_step: int, step: int, signum: int, peak: dict[str, float]
) -> Outcome:
    """Every rank has saved the checkpoint of ``step``. On Slurm rank 0 requeues the job (within the limits)."""
    extra: dict[str, Any] = {"signal": signum, **peak}
    # Only the preemption signal requeues: SIGTERM comes from Slurm ending the job (scancel, or a requeue or
    # preemption that Slurm carries out itself) and SIGINT from a terminal; both just checkpoint and exit.
    own = signum == signal_number(cfg.cluster.signal)
    target = requeue_target() if env.source == "slurm" and own else None
    if target is None:
        log.warning(
            "stopped at step %d on signal %d; checkpoint saved. Run again with the same run dir to resume", step, signum
        )
        return Outcome(RankState.STOPPED, step, extra)
    if not env.is_main:
        return Outcome(RankState.STOPPED, step, extra)
    history = record_attempt(rd, restart, start_step, step, signum)
    why_not = refusal(history, restart, cfg.cluster)
    if why_not is not None:
        raise RuntimeError(why_not)
    extra["requeued"] = target
    # Written first: once requeued, Slurm ends this job's processes (SIGTERM, then SIGKILL) at any moment.
    rd.write_status(env.rank, RankState.STOPPED, step=step, restart=restart, **extra)
    log.warning(
        "stopped at step %d on signal %d; checkpoint saved; requeueing %s (restart %d)",
        step,
        signum,
        target,
        restart + 1,
    )
    requeue(target)
    return Outcome(RankState.STOPPED, step, extra)


def _watchdog_fired(rd: RunDir, env: DistEnv, why: str) -> None:
    rd.write_failure(env.rank, why, "(stacks in the rank log)")


def _run_script(rd: RunDir, env: DistEnv, cfg: Config) -> None:
    """The user's own torchrun-style script instead of the trainer; it sets up its own process group."""
    from hpc_train.script import run_script

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
        raise RuntimeError(f"{what} exited with status {code} on rank {env.rank}")


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes through tqdm so log lines do not tear rank 0's progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never kill training
            self.handleError(record)


def _setup_logging(rd: RunDir, env: DistEnv, restart: int) -> None:
    """Each rank logs to ``logs/rank_<r>.log``; rank 0 also to the console, other ranks only warnings."""
    rd.logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(name)s: %(message)s")
    file_handler = logging.FileHandler(rd.rank_log(env.rank, restart))
    file_handler.setFormatter(fmt)
    console = _ConsoleHandler()
    console.setFormatter(logging.Formatter(f"[rank {env.rank}] %(message)s"))
    console.setLevel(logging.INFO if env.is_main else logging.WARNING)
    root = logging.getLogger("hpc_train")
    root.setLevel(logging.INFO)
    root.propagate = False
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(file_handler)
    root.addHandler(console)
    _, why = detect_source(os.environ)
    logging.getLogger("hpc_train.dist.env").info("rank resolution: source=%s (%s): %s", env.source, why, env)


def main(argv: list[str] | None = None) -> None:
    """``python -m hpc_train.worker --run-dir RUN_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m hpc_train.worker", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory holding config.yaml")
    args = parser.parse_args(argv)
    if not RunDir.holds_run(args.run_dir):
        parser.error(
            f"--run-dir {args.run_dir}: no {RunDir(args.run_dir).config.name} there (write one with `python -m hpc_train`)"
        )
    run(args.run_dir)


if __name__ == "__main__":
    main()
