"""Run a job on this machine: ``cluster=local`` (processes via submitit's LocalExecutor) or ``cluster=debug``.

submitit's local controller waits for *all* tasks, so a rank that dies early would leave its peers blocked in
a collective until the collective timeout. ``follow`` therefore watches the ranks itself (status files and
pids), and once one has failed gives the others ``cluster.failure_grace_s`` to exit before it ends the job.

The controller is started with SIGINT blocked and its stderr in ``submitit/controller.log``: it shares the
terminal's process group, and on Ctrl-C it would print its own KeyboardInterrupt traceback and SIGKILL the
ranks a second later, before they could checkpoint. The ranks inherit the block and lift it once their own
handlers are in place (``runtime.startup``), so a Ctrl-C that comes while they start is kept, not lost. The
launcher only notes a Ctrl-C while it starts the controller and serves it once it follows the ranks; it ends
the job by signalling the ranks, never through the controller.

submitit's controller is made to outlive the launcher, so a launcher killed with SIGKILL (or whose terminal
went away) would leave its ranks training on, unsupervised: a watcher process (``hpc_train.launch.watcher``),
started before the controller, stops them then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths
from submitit.local.local import LocalJob

from hpc_train.config import ClusterConfig, Config
from hpc_train.core import owner
from hpc_train.core.errors import ExitCode
from hpc_train.core.files import Tail, last_lines
from hpc_train.core.rundir import RunDir
from hpc_train.core.signals import sigterm_as_interrupt
from hpc_train.core.state import (
    RankFailure,
    RankState,
    all_ranks,
    child_alive,
    child_pids,
    completion_notes,
    process_start,
    rank_failures,
    rank_process_alive,
)
from hpc_train.core.textutil import PROGRESS_TTY, at_step, number_ranges, plural, shows_progress_bar
from hpc_train.launch.state import resume_command
from hpc_train.launch.watcher import DONE, POLL_S, ask_ranks_to_stop, task_pids, watch
from hpc_train.runtime import worker
from hpc_train.runtime.script_boot import from_the_script

__all__ = ["follow", "launch_debug", "launch_local", "watch"]


def launch_local(cfg: Config, run_dir: RunDir) -> int:
    """Start ``cluster.tasks_per_node`` ranks here, stream rank 0's output, return the job's exit code."""
    run_dir.clear_statuses()
    executor = submitit.LocalExecutor(folder=run_dir.submitit)
    executor.update_parameters(
        tasks_per_node=cfg.cluster.tasks_per_node,
        gpus_per_node=cfg.cluster.gpus_per_node,
        timeout_min=cfg.cluster.timeout_min,
    )
    if shows_progress_bar():
        os.environ[PROGRESS_TTY] = "1"  # rank 0's stderr is copied to this terminal: its bar can draw there
    watcher, tell_watcher = _start_watcher(run_dir)
    try:
        with _quiet_controller(run_dir) as interrupted:
            # A run dir with rank logs is being resumed: its ranks name their logs after the attempt.
            job = executor.submit(worker.run, str(run_dir.path), run_dir.next_attempt())
        assert isinstance(job, LocalJob)
        try:
            os.write(tell_watcher, f"{job.job_id}\n".encode())  # the controller's pid
        except OSError as exc:  # the watcher is gone (EPIPE): train all the same, and say what is missing
            print(
                f"hpc_train: warning: the watcher of this launcher ended early ({exc.strerror}; see "
                f"{run_dir.controller_log}): if this launcher is killed, stop the ranks with "
                f"`python -m hpc_train.jobs cancel {run_dir.path}`",
                file=sys.stderr,
                flush=True,
            )
        try:
            with sigterm_as_interrupt():
                world = plural(cfg.cluster.world_size, "rank")
                print(f"hpc_train: local job {job.job_id} with {world}, run dir {run_dir.path}", flush=True)
                return follow(job, run_dir, cfg.cluster, interrupted=bool(interrupted))
        except KeyboardInterrupt:  # a second Ctrl-C, or one before follow() took over: end the ranks now
            _stop(job, run_dir.submitit)
            _note_interrupted(run_dir, job.job_id)
            print(
                f"\nhpc_train: interrupted; cancelled local job {job.job_id}. Run dir: {run_dir.path}", file=sys.stderr
            )
            return ExitCode.INTERRUPTED
    finally:
        with suppress(OSError):  # said before the pipe closes: a launcher that dies never says it
            os.write(tell_watcher, DONE)
        os.close(tell_watcher)  # the watcher wakes, finds the launcher done and the job over, and exits
        with suppress(subprocess.TimeoutExpired):
            watcher.wait(timeout=5)


def launch_debug(cfg: Config, run_dir: RunDir) -> int:
    """Run the single rank in this process (submitit's DebugExecutor), so breakpoints and pdb work; a script of
    ``script.path`` or ``script.module`` runs in this process too (``runtime.script.run_here``). On a failure
    pdb's post-mortem opens where it was raised (on a terminal), then the traceback and one line say what
    happened."""
    run_dir.clear_statuses()
    executor = submitit.DebugExecutor(folder=run_dir.submitit)
    job = executor.submit(worker.run, str(run_dir.path), run_dir.next_attempt())
    try:
        job.result()  # runs the worker here
    except Exception as exc:  # noqa: BLE001 - reported with its traceback (a script's: from its own frames)
        traceback.print_exception(type(exc), exc, from_the_script(exc.__traceback__))
        why = f"{type(exc).__name__}: {exc}"
    except SystemExit as exc:  # a user's script that failed (its output is above)
        if not exc.code:
            raise
        status = run_dir.rank_statuses().get(0)
        why = (status.error if status is not None else None) or f"status {exc.code}"
    else:
        status = run_dir.rank_statuses().get(0)
        if status is not None and status.state is RankState.STOPPED:
            print(
                f"hpc_train: stopped {at_step(status.step)} on a signal (cluster=debug).\n"
                f"  resume: {resume_command(run_dir)}",
                file=sys.stderr,
                flush=True,
            )
            return ExitCode.INTERRUPTED
        print(f"hpc_train: the rank completed in this process (cluster=debug). Run dir: {run_dir.path}", flush=True)
        return 0
    print(f"hpc_train: the job failed in this process (cluster=debug): {why}. Run dir: {run_dir.path}", file=sys.stderr)
    return ExitCode.FAILED


def _start_watcher(run_dir: RunDir) -> tuple[subprocess.Popen[bytes], int]:
    """Start the watcher of this launcher (``watch``); returns it and the pipe's write end, which only this
    process holds (a pipe's ends are not inherited: submitit's controller and the ranks never get it)."""
    read_end, write_end = os.pipe()
    lease = owner.held(run_dir.path)
    argv = [
        sys.executable,
        "-c",
        "import sys; from hpc_train.launch.watcher import watch; sys.exit(watch(sys.argv[1:]))",
    ]
    argv += [
        str(read_end),
        str(run_dir.path),
        str(os.getpid()),
        str(process_start(os.getpid())),
        lease.token if lease else "",
    ]
    run_dir.submitit.mkdir(parents=True, exist_ok=True)
    try:
        with run_dir.controller_log.open("ab") as log:
            # A session of its own: no Ctrl-C from the terminal, no SIGHUP when the terminal closes.
            watcher = subprocess.Popen(
                argv, pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    if lease is not None:
        lease.add_watcher(watcher.pid)
    return watcher, write_end


@contextmanager
def _quiet_controller(run_dir: RunDir) -> Iterator[list[int]]:
    """While submitit starts its controller: SIGINT blocked and stderr to a log (both are inherited), and
    submitit's INFO lines off in the ranks (they interleave with rank 0's output; SUBMITIT_LOG_LEVEL=INFO in
    the environment brings them back). Yields a list that holds SIGINT once a Ctrl-C came meanwhile.

    Blocked, not ignored: an ignored signal is discarded, and a Ctrl-C in this window was lost (the ranks, not
    yet started, never saw it, and trained to the end: a CI failure). A blocked one stays pending: here it is
    noted when the block ends, and in the ranks, which inherit the block, it reaches their handlers once they
    lift it. The controller never lifts it, which is what keeps it out of a Ctrl-C."""
    run_dir.submitit.mkdir(parents=True, exist_ok=True)
    saved_level = os.environ.get("SUBMITIT_LOG_LEVEL")
    os.environ.setdefault("SUBMITIT_LOG_LEVEL", "WARNING")
    saved_stderr = os.dup(2)
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with run_dir.controller_log.open("ab") as log:
            sys.stderr.flush()
            os.dup2(log.fileno(), 2)
            yield interrupted
    finally:
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending Ctrl-C runs the note before this returns
        signal.signal(signal.SIGINT, previous)
        if saved_level is None:
            os.environ.pop("SUBMITIT_LOG_LEVEL", None)


def _failures(run_dir: RunDir, paths: list[JobPaths]) -> list[RankFailure]:
    """Ranks that failed; one marked live whose process is gone died without a word (its stderr says more)."""
    return rank_failures(
        run_dir.rank_statuses(),
        gone=lambda status: rank_process_alive(status) is False,
        detail=lambda rank: last_lines(paths[rank].stderr) if rank < len(paths) else "",
    )


def _stop(job: LocalJob[Any], folder: Path, timeout_s: float = 15.0) -> None:
    """End the job: SIGTERM its processes, SIGKILL what is left 2 s later; the controller then exits by itself
    (it is killed too if it has not after ``timeout_s``)."""
    for signum, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, timeout_s)):
        for pid in task_pids(job.job_id, folder):
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while not job.done() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if job.done():
            return
    with suppress(ProcessLookupError):
        os.kill(int(job.job_id), signal.SIGKILL)  # a LocalJob's id is its controller's pid


class _RankProcesses:
    """The ranks' processes, the children of submitit's controller, as seen so far. They tell a rank that ended
    before it could write a status (killed while it still imported torch): the status files alone cannot, and
    its peers would wait for it in the rendezvous until its timeout."""

    STARTED_S = 10.0
    """By then the controller has started every rank: one never seen has ended already."""

    def __init__(self, job: LocalJob[Any], run_dir: RunDir, world_size: int) -> None:
        self.controller = int(job.job_id)  # a LocalJob's id is its controller's pid
        self.run_dir = run_dir
        self.world_size = world_size
        self.since = time.monotonic()
        self.seen: set[int] = set()

    def ended_silently(self) -> int:
        """How many ranks ended without a status that says how."""
        # The ranks seen before are checked one by one: a listing of the children may miss one that is
        # alive (hpc_train.core.state.child_pids), which would count it as ended.
        candidates = self.seen | set(child_pids(self.controller))
        live = {pid for pid in candidates if child_alive(pid, self.controller)}
        self.seen |= live
        reported = {s.pid for s in self.run_dir.rank_statuses().values()}
        silent = len(self.seen - live - reported)
        if time.monotonic() - self.since > self.STARTED_S:
            silent += max(0, self.world_size - len(self.seen))
        return silent


def _any_failed(run_dir: RunDir, paths: list[JobPaths], ranks: _RankProcesses) -> bool:
    return bool(_failures(run_dir, paths)) or ranks.ended_silently() > 0


def follow(job: LocalJob[Any], run_dir: RunDir, cluster: ClusterConfig, interrupted: bool = False) -> int:
    """Stream rank 0's output until the job ends; 0 when every rank completed, else 1 (130 on Ctrl-C).
    ``interrupted``: a Ctrl-C came while the job was being started; it is served as one that comes now."""
    paths = [JobPaths(run_dir.submitit, job.job_id, rank) for rank in range(cluster.world_size)]
    tails = [Tail(paths[0].stdout, sys.stdout), Tail(paths[0].stderr, sys.stderr)]
    ranks = _RankProcesses(job, run_dir, cluster.world_size)
    deadline = time.monotonic() + cluster.timeout_min * 60 + 30  # the controller enforces the limit first
    failed_since: float | None = None
    reason = ""
    try:
        if interrupted:
            raise KeyboardInterrupt
        while not job.done():
            for tail in tails:
                tail.pump()
            now = time.monotonic()
            if failed_since is None and _any_failed(run_dir, paths, ranks):
                failed_since = now
            if failed_since is not None and now - failed_since > cluster.failure_grace_s:
                reason = f"stopped the remaining ranks {cluster.failure_grace_s:g}s after the first failure"
                _stop(job, run_dir.submitit)
            elif now > deadline:
                reason = f"the job exceeded cluster.timeout_min={cluster.timeout_min:g}"
                _stop(job, run_dir.submitit)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        if not _checkpoint_and_stop(job, run_dir, tails, cluster, lambda: _any_failed(run_dir, paths, ranks)):
            _stop(job, run_dir.submitit)
            _note_interrupted(run_dir, job.job_id)
            print(
                f"\nhpc_train: interrupted; cancelled local job {job.job_id}. Run dir: {run_dir.path}", file=sys.stderr
            )
            return ExitCode.INTERRUPTED
    for tail in tails:
        tail.pump()
    return _outcome(run_dir, paths, cluster.world_size, reason)


def _note_interrupted(run_dir: RunDir, job_id: str) -> None:
    """The launcher ended the job on a signal: ``jobs status`` reads the run as STOPPED when no rank got past its
    start-up (``launch.state``), rather than as a run nothing is known of."""
    try:
        run_dir.write_interrupted(job_id)
    except OSError as exc:  # the run dir's file system: the line the launcher prints says it all the same
        print(f"hpc_train: could not record the interruption in {run_dir.status_dir}: {exc}", file=sys.stderr)


def _checkpoint_and_stop(
    job: LocalJob[Any],
    run_dir: RunDir,
    tails: list[Tail],
    cluster: ClusterConfig,
    any_failed: Callable[[], bool],
    timeout_s: float = 120.0,
) -> bool:
    """Ctrl-C or SIGTERM: ask every rank to checkpoint (SIGTERM, which they turn into a stop at the next step
    boundary) and wait for them; True if they all ended that way. A second Ctrl-C gives up at once, and so does
    a rank that failed or ended without a word (the others cannot save a step without it): they get
    ``cluster.failure_grace_s`` to end by themselves."""
    print(
        "\nhpc_train: interrupted; the ranks checkpoint at the end of this step (Ctrl-C again to kill)", file=sys.stderr
    )
    deadline = time.monotonic() + timeout_s
    asked: dict[int, float] = {}
    try:
        while not job.done() and time.monotonic() < deadline:
            if any_failed():
                deadline = min(deadline, time.monotonic() + cluster.failure_grace_s)
            ask_ranks_to_stop(int(job.job_id), run_dir, asked)
            for tail in tails:
                tail.pump()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return False
    statuses = run_dir.rank_statuses()
    # Every rank stopped on the signal; a rank still starting when it came (no status) was simply ended.
    return job.done() and all_ranks(statuses, cluster.world_size, RankState.STOPPED)


def _outcome(run_dir: RunDir, paths: list[JobPaths], world_size: int, reason: str) -> int:
    statuses = run_dir.rank_statuses()
    if all_ranks(statuses, world_size, RankState.COMPLETED):
        who = "the rank" if world_size == 1 else f"all {world_size} ranks"
        print(f"hpc_train: {who} completed. Run dir: {run_dir.path}", flush=True)
        for note in completion_notes(statuses):  # a script that exited 0 with no sign of having trained
            print(f"hpc_train: warning: {note}", file=sys.stderr, flush=True)
        return 0
    if all_ranks(statuses, world_size, RankState.STOPPED):
        step = statuses[0].step
        checkpoint = run_dir.checkpoint(step or 0)
        saved = f"every rank is in {checkpoint}" if checkpoint.exists() else "the script saved what it saves"
        print(
            f"hpc_train: stopped {at_step(step)} on a signal; {saved}.\n  resume: {resume_command(run_dir)}",
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.INTERRUPTED
    failures = _failures(run_dir, paths)
    lines = [f"hpc_train: job FAILED. Run dir: {run_dir.path}"]
    if reason:
        lines.append(f"  ({reason})")
    if failures:
        first = failures[0]
        lines.append(f"  rank {first.rank} on {first.host} failed first: {first.summary}")
        lines += [f"  then rank {f.rank} on {f.host}: {f.summary.splitlines()[0][:160]}" for f in failures[1:5]]
        if len(failures) > 5:
            lines.append(f"  and {len(failures) - 5} more ranks: {number_ranges(f.rank for f in failures[5:])}")
        if first.rank == 0:  # its stderr was copied here as it came: the traceback is above, not repeated
            lines.append(f"  rank 0's output is above, and in {run_dir.rank_log(0)}")
        elif first.detail:
            source = "traceback" if first.reported else f"last lines of {paths[first.rank].stderr}"
            lines.append(f"--- rank {first.rank}: {source} ---")
            lines.append(first.detail.rstrip())
    missing = [r for r in range(world_size) if r not in statuses]
    if missing:
        named = missing if len(missing) <= 8 else f"{number_ranges(missing)} ({len(missing)} ranks)"
        lines.append(f"  ranks that never started: {named}; see {run_dir.submitit}/*_log.err")
        if not failures and missing:
            lines.append(last_lines(paths[missing[0]].stderr))
    print("\n".join(lines), file=sys.stderr, flush=True)
    return ExitCode.FAILED
