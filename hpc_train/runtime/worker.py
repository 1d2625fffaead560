"""What every task runs: resolve the environment, init the process group, build the Trainer, fit, close.

Launched by submitit (``run``), by an sbatch script or by hand: ``[srun|torchrun ...] python -m hpc_train.worker
--run-dir RUN_DIR``. The run directory's config is the whole input, so a task needs no pickle. Each policy lives
in its own module: start-up tuning in ``startup``, logging in ``logs``, what a stop signal leads to in
``requeue``, a user's own script in ``script``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_train.config import Config, load_config
from hpc_train.config.shape import ASKED_VARIABLE, NODES_VARIABLE, on_nodes
from hpc_train.core.errors import ExitCode
from hpc_train.core.identity import JobIdentity
from hpc_train.core.nodes import NODE_DIR_VARIABLE
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState
from hpc_train.core.textutil import plural
from hpc_train.distributed import DistEnv, resolve_environment
from hpc_train.runtime.faults import Fault, FaultObserver, armed_fault
from hpc_train.runtime.logs import setup_logging
from hpc_train.runtime.observers import Heartbeat, Kicks, ProgressFile, StartupMarks, StragglerLog, TrackerRows
from hpc_train.runtime.outcome import Fit, Outcome
from hpc_train.runtime.requeue import after_stop
from hpc_train.runtime.script import ScriptError, run_user_script
from hpc_train.runtime.startup import Startup
from hpc_train.runtime.timeouts import log_timeouts
from hpc_train.tracking import TrackerLog
from hpc_train.train.hooks import Observers
from hpc_train.train.stopping import StopSignals, signal_number
from hpc_train.train.watchdog import Watchdog

if TYPE_CHECKING:
    import torch

    from hpc_train.mirror import Mirror
    from hpc_train.train.hooks import StepObserver
    from hpc_train.train.stopping import StopSignals
    from hpc_train.train.watchdog import Watchdog

__all__ = ["main", "run"]


def run(run_dir: str | Path, attempt: int = 0) -> None:
    """Train the job described by ``<run_dir>/config.yaml`` as this process's rank; ``attempt`` is the number
    a local launcher gives a resumed run (on Slurm, the supervisor's HPC_TRAIN_ATTEMPT counts instead)."""
    with Startup() as startup:
        env = resolve_environment()
        job = JobIdentity.from_environ(launched=attempt)
        rd = RunDir(Path(run_dir)).with_node(job=_launch_key(env, job), local_ranks=env.local_world_size)
        with _node_reporting(rd):
            _run_rank(rd, env, job, startup)


def _run_rank(rd: RunDir, env: DistEnv, job: JobIdentity, startup: Startup) -> None:
    """This rank's life, from its first status to its last."""
    # Before the slow imports: launchers watch it.
    rd.write_status(env.rank, RankState.STARTING, attempt=job.attempt)
    startup.mark("resolve")
    try:
        setup_logging(rd, env, job.attempt)
        outcome = _run(rd, env, job, startup)
    except ScriptError as exc:
        # The script printed its own traceback, and the launcher prints the summary: ours, which says
        # nothing about the user's code, goes to the rank's log only, and the rank ends with status 1.
        rd.write_failure(env.rank, exc, attempt=job.attempt)
        with rd.rank_log(env.rank, job.attempt).open("a") as stream:
            stream.write(f"hpc_train: {exc}\nhpc_train: where the worker saw it:\n{traceback.format_exc()}")
        raise SystemExit(ExitCode.FAILED) from None
    except BaseException as exc:
        rd.write_failure(env.rank, exc, attempt=job.attempt)
        raise
    rd.write_status(env.rank, outcome.state, attempt=job.attempt, step=outcome.step, **outcome.extra)


def _launch_key(env: DistEnv, job: JobIdentity) -> str:
    """What the ranks of one node in one attempt share, and no other attempt does: the job (Slurm's, else the
    local launcher's), the step, the attempt."""
    launch = job.job_id or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "")
    return f"{launch or env.master_port}.{os.environ.get('SLURM_STEP_ID', '')}.{job.attempt}"


@contextmanager
def _node_reporting(rd: RunDir) -> Iterator[None]:
    """The rank takes part in reporting its node (``hpc_train.core.nodes``); the processes it starts (a user's
    script) find the node's folder in NODE_DIR_VARIABLE."""

    if rd.node is None:  # no node-local folder could be made: the rank writes its own files
        yield
        return
    os.environ[NODE_DIR_VARIABLE] = str(rd.node.folder)
    rd.node.start()
    try:
        yield
    finally:
        rd.node.close()
        os.environ.pop(NODE_DIR_VARIABLE, None)


@dataclass(frozen=True)
class RankContext:
    """What every part of a rank's life reads: its run dir, its place in the job, its config, its attempt and its
    start-up marks. Built once the config is loaded; the parts below take it instead of the five."""

    rd: RunDir
    env: DistEnv
    cfg: Config
    job: JobIdentity
    startup: Startup


class _Ending:
    """How the rank's work ended, for what closes after it: the fit (None while it runs, or after a failure) and
    the rank's outcome once it is decided."""

    def __init__(self, rank: RankContext) -> None:
        self.rank = rank
        self.fit: Fit | None = None
        self.outcome: Outcome | None = None

    def decide(self) -> None:
        """The rank's outcome: completed, or stopped (and requeued on Slurm, within the limits); nothing after a
        failure, which goes on up."""
        if self.fit is not None:
            self.outcome = _ended(self.rank, self.fit)

    @property
    def tracking(self) -> str:
        """The trackers' word for it: completed, stopped or failed."""
        if self.fit is None:
            return "failed"
        return "completed" if self.fit.completed else "stopped"


def _run(rd: RunDir, env: DistEnv, job: JobIdentity, startup: Startup) -> Outcome:

    cfg = load_config(rd.config)
    if rd.node is not None:
        rd.node.every_s = cfg.cluster.status_every_s
    if os.environ.get(NODES_VARIABLE):  # the supervisor went on with fewer nodes (cluster.min_nodes)
        cfg = on_nodes(cfg, int(os.environ[NODES_VARIABLE]))
    rank = RankContext(rd, env, cfg, job, startup)
    if cfg.script.enabled:
        if env.rank == 0 and cfg.script.torchrun_env:  # it hosts the scripts' store: torch, with the collector off
            import torch.distributed  # noqa: F401
        startup.done()
    trackers = (
        TrackerLog(rd, cfg, job.attempt) if env.is_main and cfg.tracking.enabled and not cfg.script.enabled else None
    )
    ending = _Ending(rank)
    with ExitStack() as closing:
        # Closed in reverse, after the work or its failure: the mirror first (the stop's checkpoint is the one a
        # purged run dir comes back from), then the outcome (the requeue), then the trackers (their last rows
        # must not delay the requeue).
        if trackers is not None:
            closing.callback(lambda: trackers.close(ending.tracking))
        closing.callback(ending.decide)
        mirror = _mirror(rank)
        if mirror is not None:
            closing.callback(lambda: _close_mirror(mirror, rank, ending.fit))
        if cfg.script.enabled:
            if mirror is not None:  # the run's story now; what the script wrote into the run dir at its end
                mirror.sync()
            ending.fit = run_user_script(rd, env, cfg, job, early_stop=startup.signals, startup=startup)
        else:
            ending.fit = _train(rank, trackers, mirror)
    assert ending.outcome is not None
    return ending.outcome


def _mirror(rank: RankContext) -> Mirror | None:
    """Rank 0's mirror (trainer.mirror, trainer.mirror_hook); None elsewhere or when off."""
    cfg = rank.cfg
    if not rank.env.is_main or not (cfg.trainer.mirror or cfg.trainer.mirror_hook):
        return None
    # torch (mirroring names checkpoints): after the first status, as the trainer
    from hpc_train.runtime.mirroring import open_mirror

    return open_mirror(rank.rd, cfg)


def _close_mirror(mirror: Mirror, rank: RankContext, fit: Fit | None) -> None:
    # imported with open_mirror already
    from hpc_train.runtime.mirroring import close_mirror

    close_mirror(mirror, rank.cfg, fit, rank.env.world_size)


def _ended(rank: RankContext, fit: Fit) -> Outcome:
    """The rank's outcome: completed, or stopped (and requeued on Slurm, within the limits)."""

    if fit.completed:
        return Outcome(state=RankState.COMPLETED, step=fit.step or 0, peak=fit.peak, note=fit.note)
    return after_stop(rank.rd, rank.env, rank.cfg, rank.job, fit)


def _train(rank: RankContext, trackers: TrackerLog | None, mirror: Mirror | None) -> Fit:

    # torch: after the first status, so that launchers see the rank before its 2 s of imports
    from hpc_train.distributed import distributed

    rd, env, cfg, job, startup = rank.rd, rank.env, rank.cfg, rank.job, rank.startup
    device = startup.device(cfg, env)
    startup.mark("imports")
    fault = armed_fault(attempt=job.attempt)
    if fault is not None:
        fault.at_step(env.rank, 0)  # step 0: before the rendezvous, where a lost rank hurts most
    timeouts = timedelta(seconds=cfg.trainer.dist_timeout_s), timedelta(seconds=cfg.trainer.preflight_timeout_s)
    with (
        _guards(rank) as (stop, watchdog),
        distributed(env, device, *timeouts, on_rendezvous=lambda: startup.mark("rendezvous")),
    ):
        _publish_rank_table(rd, env, device, job.attempt)
        if env.is_main:
            log_timeouts(cfg, rd, os.environ, logging.getLogger("hpc_train"))
        rd.write_status(env.rank, RankState.RUNNING, attempt=job.attempt)
        startup.mark("process_group")
        observers = _observers(rank, watchdog, fault, trackers, mirror)
        return _fit(rank, device, stop, observers)


@contextmanager
def _guards(rank: RankContext) -> Iterator[tuple[StopSignals, Watchdog]]:
    """Stop signals and the watchdog, for the whole of training.

    Signals are caught from the worker's first line (``Startup``): one that comes during start-up is kept and
    acted on after step 1, so the stop still leaves a checkpoint. The watchdog ends a rank that stops making
    progress, after writing its stacks to the rank log.
    """
    rd, env, cfg, job = rank.rd, rank.env, rank.cfg, rank.job
    stop = StopSignals([signal_number(cfg.cluster.signal), signal.SIGTERM, signal.SIGINT, signal.SIGHUP]).install()
    stop.received = stop.received or rank.startup.stop_received  # a stop that came while torch was being imported
    with rd.rank_log(env.rank, job.attempt).open("a") as stream:

        def fired(why: str) -> None:
            rd.write_failure(env.rank, why, "(stacks in the rank log)", attempt=job.attempt)

        watchdog = Watchdog(cfg.trainer.watchdog_s, stream, fired).start()
        try:
            yield stop, watchdog
        finally:
            watchdog.stop()
            stop.restore()


def _publish_rank_table(rd: RunDir, env: DistEnv, device: torch.device, attempt: int) -> None:
    """Every rank's host, device and rendezvous address, with the attempt (and for a job that asked for a node
    range, what it got, as the supervisor tells it): in rank 0's log and in the run dir."""
    # (process_group, with torch: imported by the time the table is gathered)
    from hpc_train.distributed import gather_rank_table, summarize_rank_table

    rows = gather_rank_table(env, device)
    if env.is_main:
        asked = os.environ.get(ASKED_VARIABLE, "")
        logging.getLogger("hpc_train").info(
            "rank table (attempt %d, %s%s):\n%s",
            attempt,
            plural(len(rows), "rank"),
            f"; {asked}" if asked else "",
            summarize_rank_table(rows),
        )
        rd.write_rank_table([row.entry(attempt, asked or None) for row in rows])


def _observers(
    rank: RankContext, watchdog: Watchdog, fault: Fault | None, trackers: TrackerLog | None, mirror: Mirror | None
) -> StepObserver:
    """What watches the trainer: the start-up profile, rank 0's goodput progress file and straggler verdicts, the
    watchdog, the heartbeat status, rank 0's trackers, and a test's fault (in that order: a fault at step N fires
    after step N is on record)."""
    rd, env = rank.rd, rank.env
    progress = [ProgressFile(rd, env.rank), StragglerLog(rd)] if env.is_main else []
    tracking = [TrackerRows(trackers)] if trackers is not None else []
    copies = []
    if mirror is not None:
        # imported with open_mirror already
        from hpc_train.runtime.mirroring import MirrorCopies

        copies.append(MirrorCopies(mirror))
    faults = [FaultObserver(fault, env.rank)] if fault is not None else []
    marks = StartupMarks(rank.startup, rd, env.rank, env.hostname)
    heartbeat = Heartbeat(rd, env.rank, rank.job.attempt)
    return Observers(marks, *progress, Kicks(watchdog), heartbeat, *tracking, *copies, *faults)


def _fit(rank: RankContext, device: torch.device, stop: StopSignals, observer: StepObserver) -> Fit:
    """Build the trainer, resume it, fit, close; what it reported outlives it (a failure carries its step:
    ``tag_step``)."""
    # torch: after the first status, so that launchers see the rank before its 2 s of imports
    from hpc_train.train.trainer import Trainer

    trainer = Trainer(rank.cfg, rank.env, device, rank.rd, stop=stop, observer=observer)
    trainer.resume()  # a failure here leaves nothing to close yet
    rank.startup.done()
    try:
        fit = trainer.fit()
    finally:
        trainer.close()
        # Release DDP and its pending gloo/NCCL work before the process group goes: work objects still holding
        # tensors when the interpreter shuts down can abort the process (pytorch PR #179291).
        del trainer
        gc.collect()
    return fit


def main(argv: list[str] | None = None) -> None:
    """``python -m hpc_train.worker --run-dir RUN_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m hpc_train.worker", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory written by `python -m hpc_train`")
    args = parser.parse_args(argv)
    if not RunDir.holds_run(args.run_dir):
        parser.error(
            f"--run-dir {args.run_dir}: no {RunDir(args.run_dir).config.name} there (write one with `python -m hpc_train`)"
        )
    run(args.run_dir)


if __name__ == "__main__":
    main()
