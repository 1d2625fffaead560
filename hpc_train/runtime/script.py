"""Run a user's torchrun-style script on this rank (``script.path`` / ``script.module``).

The script gets the variables torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), resolved by hpc_train from Slurm or the
local launcher, so ``dist.init_process_group("nccl"|"gloo")`` with the default env:// works unchanged.

As under torchrun, the rendezvous store is not hosted by the script's rank 0 but by the launcher side (here:
the rank-0 worker, with TORCHELASTIC_USE_AGENT_STORE=True telling every script to connect as a client), and it
stays up until every rank's script has exited. With rank 0's script hosting it, a rank 0 that finishes first
takes the store down while the others are still tearing down their process groups, and they can abort
("terminate called without an active exception"). Rank 0's worker learns that the other ranks' scripts have
ended from their status records in the run dir (each worker writes its rank's end as soon as its script
exits), so the workers of the other ranks never import torch: 2.5 CPU-s and about 190 MB less per rank
beside the script, measured here. The script runs through ``hpc_train.runtime.script_boot``,
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

import functools
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import IO, Any

from hpc_train.config import ClusterConfig, Config, ScriptConfig
from hpc_train.core.batch import GLOBAL_BATCH_VARIABLE
from hpc_train.core.errors import LaunchError, tag_step
from hpc_train.core.identity import ATTEMPT_VARIABLE, JobIdentity
from hpc_train.core.records import StartupProfile
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState, is_live, parent_pid, rank_process_alive
from hpc_train.distributed import DistEnv
from hpc_train.runtime.outcome import Fit
from hpc_train.runtime.script_boot import release_distributed
from hpc_train.runtime.script_clock import WINDOW_VARIABLE, judge_from_summaries
from hpc_train.runtime.startup import Startup
from hpc_train.tracking import script_environment
from hpc_train.train.stopping import StopSignals, signal_number

__all__ = [
    "ScriptError",
    "ScriptLaunch",
    "ScriptRun",
    "rendezvous_store",
    "run_script",
    "run_user_script",
    "script_startup",
    "script_stragglers",
    "torchrun_environment",
]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
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
    stop_to_exit_s: float | None = None
    """Seconds from passing that stop signal on to the script's exit, when it exited 0 (it saved what it saves
    and returned, as ``hpc_train.preemption`` and the integrations' callbacks do): the stop's cost, which the
    growth estimate weighs."""


TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
)
"""What torchrun gives a worker; a script run with ``script.torchrun_env=false`` gets none of them."""


def torchrun_environment(
    env: DistEnv, cluster: ClusterConfig, run_dir: str, attempt: int = 0, torchrun: bool = True
) -> dict[str, str]:
    """The variables a torchrun worker sees, for this rank, and the few ``hpc_train.preemption`` reads.
    ``torchrun=False`` (``script.torchrun_env=false``, one rank): only hpc_train's own."""
    stop = [signal_number(cluster.signal), signal.SIGTERM, signal.SIGINT]
    ours = {
        "OMP_NUM_THREADS": str(cluster.cpus_per_task),
        "HPC_TRAIN_RUN_DIR": run_dir,
        "HPC_TRAIN_RANK": str(env.rank),
        ATTEMPT_VARIABLE: str(attempt),
        "HPC_TRAIN_STOP_SIGNALS": ",".join(str(int(s)) for s in stop),
    }
    if not torchrun:
        return ours
    if cluster.stragglers.enabled and env.world_size > 1:  # script_clock times the script's DDP model
        ours[WINDOW_VARIABLE] = f"{cluster.stragglers.window_s:g}"
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
        # The store is the launcher side's (rank 0's worker), as under torchrun: the script connects as a client.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        **ours,
    }


def script_argv(script: ScriptConfig) -> list[str]:
    """The command line of the script: a file or module through ``script_boot``, or a command as it is."""
    if script.command:
        return [script.command, *script.argv]
    target = [script.path] if script.path else ["-m", script.module]
    return [sys.executable, "-m", "hpc_train.runtime.script_boot", *target, *script.argv]


class _Copy:
    """Copies one of the child's streams as it comes: to ours (the rank's console, or its Slurm or submitit
    output) as it is, and to the rank's log a whole line at a time (two streams share it, and hpc_train's own
    lines too); keeps the end for the failure report."""

    KEEP = 16384

    def __init__(self, pipe: IO[bytes], to_fd: int, log_fd: int | None, name: str) -> None:
        self._pipe, self._to, self._log, self._kept = pipe, to_fd, log_fd, b""
        self._thread = threading.Thread(target=self._copy, name=f"script-{name}", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        fd, partial = self._pipe.fileno(), b""
        while chunk := os.read(fd, 65536):
            self._write(self._to, chunk)
            lines, _, partial = (partial + chunk).rpartition(b"\n")
            if len(partial) > self.KEEP:  # no newline for long (a progress bar's \r updates): written as it is
                lines, partial = lines + b"\n" + partial if lines else partial, b""
            if lines:
                self._write(self._log, lines + b"\n")
            self._kept = (self._kept + chunk)[-self.KEEP :]
        if partial:
            self._write(self._log, partial + b"\n")

    @staticmethod
    def _write(fd: int | None, data: bytes) -> None:
        if fd is not None:
            with suppress(OSError):  # a full disk or a closed console must not stop the script
                os.write(fd, data)

    def wait(self, wait_s: float = 5.0) -> None:
        """Until the stream ends (a grandchild that holds the pipe open delays EOF: ``wait_s`` at most)."""
        self._thread.join(wait_s)

    def tail(self, lines: int = 15) -> str:
        """The last lines of what was copied."""
        return "\n".join(self._kept.decode(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class ScriptLaunch:
    """What one rank's script is started with: its command line, the variables it gets on top of this process's
    environment (the torchrun ones and the trackers'), the signals that count as a stop, and the rank's log."""

    argv: tuple[str, ...]
    variables: Mapping[str, str]
    stop_signals: frozenset[int]
    log_path: Path | None = None
    """The rank's log, which gets the script's stdout and stderr too (None: the console only)."""

    @classmethod
    def of(
        cls,
        script: ScriptConfig,
        env: DistEnv,
        cluster: ClusterConfig,
        run_dir: str,
        attempt: int,
        log_path: Path | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> ScriptLaunch:
        """The launch of ``script`` as this rank, in this attempt; ``extra``: variables of the caller's (the
        trackers' runs, the global batch), which the torchrun ones override."""
        variables = {**(extra or {}), **torchrun_environment(env, cluster, run_dir, attempt, script.torchrun_env)}
        stops = frozenset(int(s) for s in variables["HPC_TRAIN_STOP_SIGNALS"].split(","))
        return cls(tuple(script_argv(script)), variables, stops, log_path)


@contextmanager
def rendezvous_store(
    env: DistEnv, torchrun_env: bool, timeout: timedelta, peers_ended: Callable[[], bool] = lambda: True
) -> Iterator[None]:
    """On rank 0, with the torchrun environment: this process hosts the scripts' rendezvous store for the block
    (they connect as clients, TORCHELASTIC_USE_AGENT_STORE), and keeps it up after the block until
    ``peers_ended()`` (every other rank's script has ended), ``timeout`` at most. Elsewhere: nothing."""
    if env.rank != 0 or not torchrun_env:
        yield
        return
    store = _host_store(env, timeout)
    yield
    _keep_until(peers_ended, timeout)
    del store  # the server stops with its last reference


class _Forward:
    """Passes the signals that reach this rank on to the script while it runs (``installed``), and remembers the
    first stop signal among them and when it came. A hang-up is a stop: the script hears the SIGTERM it knows
    how to handle."""

    def __init__(self, child: subprocess.Popen[bytes], stops: frozenset[int]) -> None:
        self.child, self.stops = child, stops
        self.stopped_by, self.stopped_at = 0, 0.0

    def __call__(self, signum: int, frame: FrameType | None = None) -> None:
        if signum == signal.SIGHUP:
            signum = signal.SIGTERM
        if signum in self.stops and not self.stopped_by:
            self.stopped_by, self.stopped_at = signum, time.monotonic()
        self.child.send_signal(signum)

    @contextmanager
    def installed(self) -> Iterator[_Forward]:
        previous = {sig: signal.signal(sig, self) for sig in FORWARDED}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_script(launch: ScriptLaunch, early_stop: StopSignals | None = None) -> ScriptRun:
    """Run the script as a child process with ``launch``'s environment, until it exits.

    Signals that reach this rank (Slurm's preemption signal, Ctrl-C, SIGTERM) are passed on to the script;
    the first stop signal among them is remembered. ``early_stop``: the handlers of the rank's start-up; a
    signal they caught (up to the moment this one takes over, the store's start included) is passed on as
    soon as the script runs. The caller hosts the rendezvous store around it (``rendezvous_store``).
    """
    inherited = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    log_path = launch.log_path
    log_fd = None if log_path is None else os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # A terminal (cluster=debug with script.command) keeps the script's stdout: it stays line-buffered there.
    # stderr is always copied, for the failure report.
    to_terminal = os.isatty(sys.stdout.fileno())
    try:
        child = subprocess.Popen(
            list(launch.argv),
            env={**inherited, **launch.variables},
            stdout=None if to_terminal else subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stderr is not None
        copies = [_Copy(child.stderr, sys.stderr.fileno(), log_fd, "stderr")]
        if child.stdout is not None:
            copies.append(_Copy(child.stdout, sys.stdout.fileno(), log_fd, "stdout"))
        with _Forward(child, launch.stop_signals).installed() as forward:
            if early_stop is not None and early_stop.received:
                forward(early_stop.received)
            code = child.wait()
            exited = time.monotonic()
        for copy in copies:  # every copy ends before the log is closed
            copy.wait()
        tail = copies[0].tail()
    finally:
        if log_fd is not None:
            os.close(log_fd)
    stop_s = exited - forward.stopped_at if forward.stopped_by and code == 0 else None
    return ScriptRun(code, forward.stopped_by, tail, stop_s)


def run_here(script: ScriptConfig, variables: dict[str, str]) -> ScriptRun:
    """``cluster=debug``: the script in this process, as ``python script.py`` (or ``-m``) would run it, with one
    rank's environment, so that a breakpoint works and pdb's post-mortem lands in the script's own frame. An
    exception from the script goes on up as it is; ``sys.exit`` becomes the exit status. The environment,
    ``sys.argv`` and ``sys.path`` are put back afterwards."""

    saved = dict(os.environ), list(sys.argv), list(sys.path)
    for key in TORCHRUN_VARIABLES:
        os.environ.pop(key, None)
    # One rank, and no launcher side to hold the store: the script's rank 0 hosts its own, as under plain python.
    os.environ.update({k: v for k, v in variables.items() if k != "TORCHELASTIC_USE_AGENT_STORE"})
    code = 0
    try:
        if script.module:
            sys.argv = [script.module, *script.argv]
            runpy.run_module(script.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [script.path, *script.argv]
            sys.path.insert(0, os.path.dirname(os.path.abspath(script.path)))  # as `python path` would have it
            runpy.run_path(script.path, run_name="__main__")
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # sys.exit("message"), as the interpreter would print it
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        release_distributed()
        environ, sys.argv, sys.path[:] = saved[0], saved[1], saved[2]
        os.environ.clear()
        os.environ.update(environ)
    return ScriptRun(code, 0, "" if code == 0 else f"the script called sys.exit({code})")


def run_user_script(
    rd: RunDir,
    env: DistEnv,
    cfg: Config,
    job: JobIdentity,
    early_stop: StopSignals | None = None,
    startup: Startup | None = None,
) -> Fit:
    """The user's torchrun-style script instead of the trainer; it sets up its own process group.

    Returns like the trainer does: completed, or stopped on a signal (with the steps the script reported
    through ``hpc_train.preemption``, if it did); raises ScriptError when it failed. The script's stdout and
    stderr go to this rank's log as well as to its console (or Slurm and submitit output). ``startup``: the
    worker's start-up marks, completed with the script's part (``script_startup``).
    """
    rd.write_status(env.rank, RankState.RUNNING, attempt=job.attempt)
    rd.progress(env.rank).unlink(missing_ok=True)
    what = cfg.script.path or cfg.script.module or cfg.script.command
    if cfg.script.torchrun_env:
        how = f"with the torchrun environment (master {env.master_addr}:{env.master_port})"
    else:
        how = "as a plain process (script.torchrun_env=false: no RANK, LOCAL_RANK, WORLD_SIZE or MASTER_ADDR)"
    log.info("running %s on rank %d %s; its output follows", what, env.rank, how)
    timeout = timedelta(seconds=cfg.trainer.dist_timeout_s)
    before = _Files.snapshot(rd) if env.is_main else None
    started = time.monotonic()
    # The run dir's tracker runs, as the trackers' own libraries read them (MLFLOW_RUN_ID, WANDB_RUN_ID, ...).
    trackers = script_environment(rd, cfg)
    if cfg.script.global_batch is not None:  # the script splits it over today's ranks (hpc_train.global_batch)
        trackers[GLOBAL_BATCH_VARIABLE] = str(cfg.script.global_batch)
    with script_startup(rd, env, startup or Startup()), script_stragglers(rd, env, cfg):
        if cfg.cluster.launcher == "debug" and not cfg.script.command:
            variables = torchrun_environment(env, cfg.cluster, str(rd.path), job.attempt, cfg.script.torchrun_env)
            run = run_here(cfg.script, trackers | variables)
        else:
            log_path = rd.rank_log(env.rank, job.attempt)
            launch = ScriptLaunch.of(cfg.script, env, cfg.cluster, str(rd.path), job.attempt, log_path, trackers)
            peers_ended = functools.partial(scripts_ended, rd, env, job.attempt)
            with rendezvous_store(env, cfg.script.torchrun_env, timeout, peers_ended):
                run = run_script(launch, early_stop)
    progress = rd.progress_record(env.rank)
    first, last = progress.first_step, progress.step
    start = None if first is None else first - 1
    if run.stopped_by:
        log.warning("%s ended with status %d after signal %d on rank %d", what, run.code, run.stopped_by, env.rank)
        return Fit(completed=False, start_step=start, step=last, signal=run.stopped_by, stop_saved_s=run.stop_to_exit_s)
    if run.code != 0:
        how = f"was killed by {signal.Signals(-run.code).name}" if run.code < 0 else f"exited with status {run.code}"
        last_line = next((line for line in reversed(run.stderr_tail.splitlines()) if line.strip()), "")
        message = f"{what} {how} on rank {env.rank}" + (f": {last_line.strip()}" if last_line else "")
        error = ScriptError(message + _hint(cfg, run.stderr_tail), run.stderr_tail)
        if last is not None:
            tag_step(error, last)  # the last step the script reported
        raise error
    note = None
    if last is None and before is not None and not before.changed():
        note = (
            f"{what} exited 0 after {time.monotonic() - started:.1f} s with no progress reported: no step through "
            f"hpc_train.preemption and no file written in {rd.path} or {os.getcwd()}; did it train?"
        )
        log.warning("%s", note)
    return Fit(completed=True, start_step=start or 0, step=last or 0, signal=0, note=note)


FIRST_STEP_POLL_S = 1.0
"""How often a rank's worker looks in its node's folder for its script's first reported step."""


@contextmanager
def script_startup(rd: RunDir, env: DistEnv, startup: Startup) -> Iterator[None]:
    """The start-up profile of a rank whose work is a user's script, as far as hpc_train sees it.

    The worker's own phases (interpreter, resolve, imports) are reported as the script starts. The script's part, from
    then to the first step it reports (``hpc_train.preemption``, or the Hugging Face and Lightning callbacks),
    is one phase, ``script``: hpc_train cannot tell its imports, process group, data and model apart. The
    worker looks for that step in the node's folder every FIRST_STEP_POLL_S (node-local, no shared file system
    traffic); a rank with no node folder, and a script that ends within a poll, are looked at once, at the end.
    A script that reports no step has no ``script`` phase.
    """
    startup.mark("imports")  # the worker's: its config, and torch where rank 0 hosts the scripts' store
    _report_startup(rd, startup.profile(env.rank, env.hostname))
    ended = threading.Event()

    def first_step() -> bool:
        node = rd.node
        progress = node.progress(env.rank) if node is not None else rd.progress_record(env.rank)
        if progress is None or not progress.first_time:
            return False
        startup.mark("script", at=progress.first_time)
        profile = startup.profile(env.rank, env.hostname)
        log.info("%s", profile.describe())
        _report_startup(rd, profile)
        return True

    def watch() -> None:
        with suppress(OSError):
            while not ended.wait(FIRST_STEP_POLL_S):
                if first_step():
                    return

    watcher = threading.Thread(target=watch, name="hpc_train-script-startup", daemon=True)
    if rd.node is not None:
        watcher.start()
    try:
        yield
    finally:
        ended.set()
        if watcher.is_alive():
            watcher.join(timeout=FIRST_STEP_POLL_S + 1)
        if "script" not in startup.marks:
            with suppress(OSError):
                first_step()


@contextmanager
def script_stragglers(rd: RunDir, env: DistEnv, cfg: Config) -> Iterator[None]:
    """Rank 0's worker, while its script runs: every cluster.stragglers.window_s, the ranks' own compute times
    from the nodes' summaries (``script_clock``) judged, and the verdict logged and recorded as the built-in
    trainer's is (``StragglerLog``). Nothing on other ranks, on one rank, or with stragglers off."""
    sc = cfg.cluster.stragglers
    if env.rank != 0 or env.world_size < 2 or not sc.enabled or not cfg.script.torchrun_env:
        yield
        return
    # torch only on rank 0 of a multi-rank script: the other ranks' workers stay without it
    from hpc_train.distributed.stragglers import StragglerJudge
    from hpc_train.runtime.observers import StragglerLog

    judge, verdicts, ended = StragglerJudge(margin=sc.margin, windows=sc.windows), StragglerLog(rd), threading.Event()

    def watch() -> None:
        while not ended.wait(sc.window_s):
            try:
                # A figure reaches status/ with its node's summary, every cluster.status_every_s: "fresh" is two
                # windows or two summaries, whichever is longer (else a short window would judge none).
                fresh = max(sc.window_s, cfg.cluster.status_every_s)
                report = judge_from_summaries(rd.node_summaries(), judge, time.time(), fresh)
                if report is not None:
                    verdicts.on_stragglers(report)
                    if rd.node is not None:  # for the trackers of rank 0's script (the integrations' callbacks)
                        rd.node.publish_stragglers(report)
            except OSError as exc:  # the run dir's file system: tried again at the next window
                log.warning("hpc_train: the straggler figures could not be read: %s", exc)

    watcher = threading.Thread(target=watch, name="hpc_train-stragglers", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        ended.set()
        watcher.join(timeout=5)


def _report_startup(rd: RunDir, profile: StartupProfile) -> None:
    if rd.node is not None:
        with suppress(OSError):
            rd.node.report_startup(profile)


def _hint(cfg: Config, stderr: str) -> str:
    """A HINT for a failure whose cause the config shows: NCCL asked for on a job without GPUs."""
    if "nccl" in stderr.lower() and cfg.cluster.gpus_per_node == 0:
        one_rank = cfg.cluster.world_size == 1 and cfg.script.torchrun_env
        return (
            " HINT: the script uses NCCL, which needs GPUs, but cluster.gpus_per_node=0 gives the ranks none (and a "
            "CPU build of torch has no NCCL). Give the job GPUs (cluster.gpus_per_node=N, on a partition that has "
            "them), or have the script use gloo on CPU (init_process_group(backend='gloo'))."
            + (
                " If the script takes its DDP path only because LOCAL_RANK is set (DeepLIIF does), "
                "script.torchrun_env=false runs it as one plain process."
                if one_rank
                else ""
            )
        )
    return ""


class _Files:
    """A bounded look at the files under the run dir and the working directory, to tell whether a script that
    exited 0 wrote anything, hpc_train's own folders aside. A new file is a sign of training. So is a file that
    changed, unless it is console output, which grows whatever the script does: a log-like name (``.log``,
    ``.out``, ``.err``, ``.txt``: ``> train.log``, ``| tee``, Slurm's ``slurm-<job>.out``) or the stdout or
    stderr of this process or one it descends from. Too many files to look at: it cannot tell, and says that
    something changed (no warning)."""

    LIMIT = 5000
    """Files looked at, at most, before the script starts and after it ends: each is a stat, which on a shared
    file system costs about a millisecond, and the script's start waits for the first look."""
    DEPTH = 4
    CONSOLE_SUFFIXES = (".log", ".out", ".err", ".txt")

    def __init__(self, roots: list[Path], skip: set[Path]) -> None:
        self.roots, self.skip = roots, skip
        self.seen = self._look()

    @classmethod
    def snapshot(cls, rd: RunDir) -> _Files:
        run = rd.path.resolve()
        skip = {run / name for name in (rd.logs.name, rd.status_dir.name, rd.submitit.name, ".hydra")}
        return cls([run, Path.cwd().resolve()], skip)

    def _look(self) -> dict[str, int] | None:
        seen: dict[str, int] = {}
        stack = [(root, 0) for root in self.roots]
        while stack:
            folder, depth = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if len(seen) >= self.LIMIT:
                    return None
                path = Path(entry.path)
                if path in self.skip or entry.name.startswith("."):
                    continue
                with suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        if depth < self.DEPTH:
                            stack.append((path, depth + 1))
                    elif entry.is_file(follow_symlinks=False):
                        seen[entry.path] = entry.stat(follow_symlinks=False).st_mtime_ns
        return seen

    def changed(self) -> bool:
        """Whether a file appeared, or one that is not console output changed, since the snapshot (True when
        either look could not tell)."""
        now = self._look()
        if self.seen is None or now is None:
            return True
        console = _console_files()
        for path, mtime in now.items():
            if path not in self.seen:
                return True
            if self.seen[path] != mtime and not path.endswith(self.CONSOLE_SUFFIXES) and path not in console:
                return True
        return False


def _console_files() -> set[str]:
    """The files that this process and the processes it descends from write their stdout and stderr to."""

    found: set[str] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1:
        for fd in (1, 2):
            with suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        pid = parent_pid(pid)
    return found


def _host_store(env: DistEnv, timeout: timedelta) -> Any:
    """The rendezvous store the scripts connect to as clients (TORCHELASTIC_USE_AGENT_STORE), served here."""
    # torch only on the rank that hosts the scripts' store
    import torch.distributed as dist

    # torch's stubs do not re-export TCPStore (it lives in torch._C).
    return dist.TCPStore(  # type: ignore[attr-defined]
        env.master_addr, env.master_port, is_master=True, timeout=timeout, wait_for_workers=False
    )


def _keep_until(peers_ended: Callable[[], bool], timeout: timedelta) -> None:
    """Rank 0's script has exited: wait until the other ranks' scripts have too (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout.total_seconds()
    while not peers_ended():
        if time.monotonic() >= deadline:
            log.warning("the other ranks' scripts had not all ended %.0f s after rank 0's", timeout.total_seconds())
            return
        time.sleep(0.2)


def scripts_ended(rd: RunDir, env: DistEnv, attempt: int) -> bool:
    """Whether every rank but rank 0 has ended its script in this attempt: its worker wrote its end (completed,
    stopped or failed) with this ``attempt``'s number, or the process that said it runs here is gone. The
    supervisor and the local launcher clear the ranks' statuses before each attempt."""
    statuses = rd.rank_statuses()
    for rank in range(1, env.world_size):
        status = statuses.get(rank)
        if status is None or status.attempt != attempt:
            return False
        if is_live(status) and rank_process_alive(status) is not False:
            return False
    return True
