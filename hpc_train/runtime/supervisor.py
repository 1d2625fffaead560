"""In-allocation restart: the batch step supervises the training step and starts it again after a failure.

Every Slurm job of hpc_train runs this in its batch step (``python -m hpc_train.supervisor --run-dir RUN_DIR``
in the sbatch script, or the call submitit pickles). It picks ``cluster.nodes`` healthy nodes of the
allocation, runs the training step on them with srun (``python -m hpc_train.worker`` on every task) and waits.
When the step fails in a way worth retrying (``hpc_train.runtime.failures``), it starts a new step in the same
allocation: no new job, no queue wait. The ranks resume from the newest complete checkpoint.

- Nodes blamed for the failure go on the run's bad-node list (``status/bad_nodes.json``); with
  ``cluster.spare_nodes`` the next attempt runs without them, and when fewer than ``cluster.nodes`` healthy
  nodes are left the job ends (EXIT_GAVE_UP). Without spares the next attempt reuses the node.
- At most ``cluster.max_failures`` restarts per job, and at most ``cluster.max_stalled_failures`` failed
  attempts in a row without a new checkpoint; then the job ends (EXIT_GAVE_UP).
- A fatal failure (the same exception from the same step twice in a row, an import error, a config error)
  ends the job at once (EXIT_FATAL), with no retry and no requeue.
- A stop signal (preemption, the time limit, scancel) is the ranks' business: they checkpoint and requeue the
  job; the supervisor starts nothing more.

Every attempt is recorded in ``status/attempts.json`` and the goodput ledger in ``status/goodput.json``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO

from hpc_train.config import ClusterConfig, load_config
from hpc_train.core.errors import EXIT_FATAL, EXIT_GAVE_UP
from hpc_train.core.goodput import ledger
from hpc_train.core.hostlist import expand_hostlist
from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Progress, RankState, RankStatus
from hpc_train.core.rundir import ATTEMPT_VARIABLE, RunDir
from hpc_train.runtime.commands import WORKER, srun_argv
from hpc_train.runtime.failures import Failure, SrunReport, classify
from hpc_train.train.stopping import StopSignals, signal_number

__all__ = ["EXIT_FATAL", "EXIT_GAVE_UP", "main", "run", "supervise"]

STOP_GRACE_S = 30
"""After a stop signal, how long srun gets beyond cluster.srun_wait_s before the supervisor ends it."""
LAUNCH_GRACE_S = 120
"""How long, beyond trainer.preflight_timeout_s, a step may go without any rank writing its first status
before the supervisor ends srun (it never got its tasks running: a node that cannot start them, a step that
Slurm keeps waiting)."""
SRUN_LINES = 500
LINE_LIMIT = 4096


def _say(message: str, stream: IO[str] | None = None) -> None:
    print(f"hpc_train supervisor: {message}", file=stream or sys.stderr, flush=True)


def pick_nodes(allocation: list[str], bad: list[str], cluster: ClusterConfig) -> list[str] | str:
    """The nodes of the next attempt, or why there are not enough.

    With spares, blamed nodes are left out; without, every node of the allocation is used again.
    """
    if not cluster.spare_nodes:
        return allocation[: cluster.nodes]
    healthy = [n for n in allocation if n not in bad]
    if len(healthy) < cluster.nodes:
        return (
            f"no healthy node left: training needs {cluster.nodes} nodes; of the allocation "
            f"{','.join(allocation)}, {','.join(n for n in allocation if n in bad)} failed before. HINT: ask for "
            "more spares (cluster.spare_nodes), or resubmit: the run dir resumes from its last checkpoint and "
            f"cluster.exclude can keep those nodes out"
        )
    return healthy[: cluster.nodes]


def step_argv(rd: RunDir, cluster: ClusterConfig, nodes: list[str], python: str) -> list[str]:
    """The srun command of one training step on ``nodes``; cluster.srun_args come last, so they win."""
    srun, *options = srun_argv(cluster)
    return [
        srun,
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes) * cluster.tasks_per_node}",
        f"--ntasks-per-node={cluster.tasks_per_node}",
        f"--cpus-per-task={cluster.cpus_per_task}",
        f"--nodelist={','.join(nodes)}",
        *options,
        *cluster.container_argv,
        python,
        "-u",
        "-m",
        WORKER,
        "--run-dir",
        str(rd.path),
    ]


class _Step:
    """One srun. Its stderr is copied through byte for byte (a progress bar's carriage returns included) and
    srun's own lines (``srun: ...``) are kept, the latest ``SRUN_LINES``, for ``SrunReport``."""

    def __init__(self, argv: list[str], env: Mapping[str, str], forward_stop: int = 0) -> None:
        self.lines: deque[str] = deque(maxlen=SRUN_LINES)
        self.forward_stop = forward_stop
        """The signal to pass to srun when this process gets a stop (0: none). Not SIGTERM or SIGINT: srun
        answers those by ending the step, with SIGKILL after KillWait; it forwards USR1/USR2 to the tasks."""
        # Forwarding (an interactive allocation): srun gets its own process group, so that a terminal's Ctrl-C
        # reaches only the supervisor, which passes a stop on; srun's own first Ctrl-C only prints status.
        self.proc = subprocess.Popen(argv, env=dict(env), stderr=subprocess.PIPE, start_new_session=bool(forward_stop))
        self._reader = threading.Thread(target=self._copy, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _copy(self, stream: IO[bytes]) -> None:
        out = getattr(sys.stderr, "buffer", None)
        partial = b""
        while chunk := os.read(stream.fileno(), 65536):
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
            *complete, partial = (partial + chunk).split(b"\n")
            partial = partial[-LINE_LIMIT:]  # a progress bar redraws without a newline for as long as it runs
            self.lines.extend(line.decode(errors="replace") for line in complete if line.startswith(b"srun:"))
        if partial.startswith(b"srun:"):
            self.lines.append(partial.decode(errors="replace"))

    def wait(self, signals: StopSignals, grace_s: float, started: Callable[[], bool], launch_s: float) -> int:
        """srun's exit status. After a stop signal srun gets ``grace_s`` before it is ended; when no rank has
        ``started()`` within ``launch_s`` (the step never launched), it is ended too."""
        began = time.monotonic()
        signalled_at: float | None = None
        launched = False
        while True:
            try:
                code = self.proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.forward_stop and signals.count > 1:  # a second Ctrl-C: no checkpoint wanted, end it now
                _say("a second stop signal; ending srun")
                code = self._end()
                break
            if signals.received and signalled_at is None:
                signalled_at = time.monotonic()
                if self.forward_stop:  # srun passes it on to every task: they checkpoint and stop
                    self.proc.send_signal(self.forward_stop)
            if signalled_at is not None and time.monotonic() - signalled_at > grace_s:
                _say(f"srun still runs {grace_s:.0f}s after signal {signals.received}; ending it")
                code = self._end()
                break
            launched = launched or started()
            if not launched and signalled_at is None and time.monotonic() - began > launch_s:
                _say(f"no rank of the step started within {launch_s:.0f}s; ending srun")
                self.launch_timed_out = True
                code = self._end()
                break
        self._reader.join(timeout=10)
        return code

    launch_timed_out = False

    def _end(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=15)


def _made_progress(attempt: AttemptRecord) -> bool:
    """True when the attempt left a newer checkpoint than it resumed from (a user's script, which does not
    tell its checkpoints: a step beyond the one it resumed from)."""
    progress = attempt.progress or Progress()
    if progress.first_step is None:
        return False
    saved = progress.checkpoint_step
    if saved is None and attempt.script:
        saved = progress.step
    return saved is not None and saved > progress.first_step - 1


class Supervisor:
    def __init__(self, rd: RunDir, environ: Mapping[str, str], interactive: bool = False) -> None:
        self.rd = rd
        self.interactive = interactive
        """Run from a shell in an allocation (cluster.submit=here): stop signals reach this process only, and
        are passed on to the training step."""
        self.environ = environ
        self.cfg = load_config(rd.config)
        self.cluster = self.cfg.cluster
        nodelist = environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise SystemExit("hpc_train.supervisor runs inside a Slurm job's batch step (SLURM_JOB_NODELIST unset)")
        self.allocation = expand_hostlist(nodelist)
        self.job_id = environ.get("SLURM_JOB_ID", "")
        if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
            self.job_id = f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
        # `scontrol requeue` keeps the job id: an allocation is the job id and Slurm's restart count.
        self.requeue = int(environ.get("SLURM_RESTART_COUNT") or 0)
        hangup = [signal.SIGHUP] if interactive else []  # the terminal that runs it closed
        self.signals = StopSignals([signal_number(self.cluster.signal), signal.SIGTERM, signal.SIGINT, *hangup])
        self.python = self.cluster.python or sys.executable

    # ---- the ledger ---------------------------------------------------------------------------------------

    def _mine(self, record: AttemptRecord | Allocation | None) -> bool:
        """Whether an allocation or attempt record belongs to this allocation."""
        return record is not None and record.allocation == (self.job_id, self.requeue)

    def _begin_allocation(self) -> None:
        self._close_abandoned()
        mine = Allocation(job_id=self.job_id, requeue=self.requeue, nodes=tuple(self.allocation), start=time.time())
        self.rd.write_allocations([*self.rd.allocation_records(), mine])

    def _close_abandoned(self) -> None:
        """Close what an earlier batch step left open: it was killed before it could (Slurm ended the job on a
        node failure, a KillWait ran out). Each ends at the last time it is known to have been alive, so that
        the ledger does not count it as running until now."""
        attempts = self.rd.attempt_records()
        abandoned = False
        last_seen = 0.0
        for i, entry in enumerate(attempts):
            if entry.end is None:
                abandoned = True
                progress = entry.progress or (self.rd.progress_record(0) if i == len(attempts) - 1 else Progress())
                if (progress.first_time or 0) < (entry.start or 0):
                    progress = Progress()  # an earlier attempt's: this one never made a step
                seen = [t for t in (entry.start, progress.time, progress.checkpoint_time) if t is not None]
                entry = attempts[i] = replace(
                    entry,
                    end=max(seen, default=0.0),
                    progress=progress,
                    outcome=AttemptOutcome.LOST,
                    message="its batch step ended before it could record how the attempt ended",
                )
            last_seen = max(last_seen, entry.end or 0.0)
        if abandoned:
            self.rd.write_attempts(attempts)
        allocations = self.rd.allocation_records()
        if any(a.end is None for a in allocations):
            closed = [a if a.end is not None else replace(a, end=max(a.start, last_seen)) for a in allocations]
            self.rd.write_allocations(closed)

    def _end_allocation(self) -> None:
        allocations = self.rd.allocation_records()
        if allocations and self._mine(allocations[-1]):
            allocations[-1] = replace(allocations[-1], end=time.time())
            self.rd.write_allocations(allocations)
        self._write_goodput()

    def _write_goodput(self) -> None:
        self.rd.write_goodput(ledger(self.rd.allocation_records(), self.rd.attempt_records()))

    def _save_attempt(self, entry: AttemptRecord) -> None:
        attempts = self.rd.attempt_records()
        if attempts and attempts[-1].attempt == entry.attempt:
            attempts[-1] = entry
        else:
            attempts.append(entry)
        self.rd.write_attempts(attempts)

    # ---- the loop -----------------------------------------------------------------------------------------

    def run(self) -> int:
        self.signals.install()
        self._begin_allocation()
        try:
            return self._loop()
        finally:
            self._end_allocation()
            self.signals.restore()

    def _loop(self) -> int:
        while True:
            attempts = self.rd.attempt_records()  # a damaged entry is left out: it must not stop the recovery
            last = attempts[-1] if attempts else None
            number = max(len(attempts), self.rd.next_attempt(), last.attempt + 1 if last is not None else 0)
            bad = [node.host for node in self.rd.bad_node_records()]
            nodes = pick_nodes(self.allocation, bad, self.cluster)
            if isinstance(nodes, str):
                return self._give_up(last if self._mine(last) else None, nodes)
            if self.signals.received:
                _say(f"signal {self.signals.received} came before attempt {number}; not starting it")
                return 0
            entry = self._attempt(number, nodes)
            if entry.outcome is AttemptOutcome.COMPLETED:
                return 0
            if entry.outcome is AttemptOutcome.STOPPED:
                return entry.exit_code or 0
            failure = entry.failure
            assert failure is not None  # an attempt that neither completed nor stopped failed
            if not failure.retryable:
                self._save_attempt(replace(entry, outcome=AttemptOutcome.FATAL))
                _say(f"fatal failure, not retried and not requeued (exit {EXIT_FATAL}): {failure.describe()}")
                return EXIT_FATAL
            why_not = self._refusal()
            if why_not is not None:
                return self._give_up(entry, why_not)
            if self.cluster.spare_nodes:
                for host in failure.suspects:
                    if host in self.allocation:
                        self.rd.add_bad_node(host, failure.describe(), number)
            _say(f"attempt {number} failed ({failure.describe()}); starting attempt {number + 1} in this allocation")

    def _attempt(self, number: int, nodes: list[str]) -> AttemptRecord:
        self.rd.clear_statuses()
        entry = AttemptRecord(
            attempt=number,
            job_id=self.job_id,
            requeue=self.requeue,
            nodes=tuple(nodes),
            start=time.time(),
            outcome=AttemptOutcome.RUNNING,
            script=self.cfg.script.enabled,
        )
        self._save_attempt(entry)
        self._write_goodput()
        argv = step_argv(self.rd, self.cluster, nodes, self.python)
        _say(f"attempt {number} on {','.join(nodes)}: {shlex.join(argv)}", sys.stdout)
        step = _Step(argv, {**self.environ, ATTEMPT_VARIABLE: str(number)}, forward_stop=self._forwarded())
        launch_s = self.cfg.trainer.preflight_timeout_s + LAUNCH_GRACE_S
        try:
            code = step.wait(
                self.signals, self.cluster.srun_wait_s + STOP_GRACE_S, lambda: bool(self._statuses(number)), launch_s
            )
        finally:
            if step.proc.poll() is None:  # this process is going away: its step (own session, maybe) goes too
                step._end()
        entry = replace(entry, end=time.time(), exit_code=code, progress=self.rd.progress_record(0))
        statuses = self._statuses(number)
        if all(r in statuses and statuses[r].state is RankState.COMPLETED for r in range(self.cluster.world_size)):
            entry = replace(entry, outcome=AttemptOutcome.COMPLETED)
        elif self._stopped(statuses):
            entry = replace(entry, outcome=AttemptOutcome.STOPPED)
        else:
            attempts = self.rd.attempt_records()
            previous = attempts[-2].failure if len(attempts) > 1 else None
            failure = classify(statuses, SrunReport.parse(step.lines), code, previous)
            if step.launch_timed_out:
                error = f"no rank of the step started within {launch_s:.0f}s; the supervisor ended srun"
                failure = Failure(kind="unknown", error=error)
            entry = replace(entry, outcome=AttemptOutcome.FAILED, failure=failure)
            _log_failure(failure)
        self._save_attempt(entry)
        self._write_goodput()
        return entry

    def _forwarded(self) -> int:
        """From a shell (cluster.submit=here), a stop reaches only this process: it passes cluster.signal on."""
        return signal_number(self.cluster.signal) if self.interactive else 0

    def _statuses(self, attempt: int) -> dict[int, RankStatus]:
        """The ranks' statuses from this attempt: a rank of an earlier one that outlived its step (on a node
        cut off from Slurm) may still write its own."""
        return {r: s for r, s in self.rd.rank_statuses().items() if s.attempt in (None, attempt)}

    def _stopped(self, statuses: Mapping[int, RankStatus]) -> bool:
        """The step ended on a stop signal: this batch step got one (scancel, Slurm's requeue), or the ranks
        stopped on the preemption signal (and requeued the job). Ranks that stopped on the SIGTERM srun sends
        after another task failed do not count: that is a failure."""
        if self.signals.received:
            return True
        own = signal_number(self.cluster.signal)
        return any(s.state is RankState.STOPPED and (s.signal == own or s.requeued) for s in statuses.values())

    def _refusal(self) -> str | None:
        attempts = self.rd.attempt_records()
        here = [a for a in attempts if self._mine(a) and a.failure is not None]
        if len(here) > self.cluster.max_failures:
            return (
                f"not restarted: {len(here)} failures in this job (cluster.max_failures={self.cluster.max_failures})."
                " HINT: look at the failures in `python -m hpc_train.jobs status`; raise cluster.max_failures, or"
                " resubmit: the run dir resumes from its last checkpoint"
            )
        stalled = 0
        for attempt in reversed(attempts):
            if attempt.failure is None or _made_progress(attempt):
                break
            stalled += 1
        if stalled > self.cluster.max_stalled_failures:
            return (
                f"not restarted: the last {stalled} attempts failed without saving a new checkpoint "
                f"(cluster.max_stalled_failures={self.cluster.max_stalled_failures}). HINT: checkpoint more often "
                "(trainer.checkpoint_every_n_steps) or fix what fails"
            )
        return None

    def _give_up(self, entry: AttemptRecord | None, why: str) -> int:
        _say(f"giving up (exit {EXIT_GAVE_UP}): {why}")
        if entry is not None:
            self._save_attempt(replace(entry, outcome=AttemptOutcome.GAVE_UP, message=why))
        return EXIT_GAVE_UP


def _log_failure(failure: Failure) -> None:
    _say(f"the training step failed: {failure.describe()}")
    if failure.traceback:
        tail = "\n".join(failure.traceback.strip().splitlines()[-8:])
        print(tail, file=sys.stderr, flush=True)


def supervise(rd: RunDir, environ: Mapping[str, str] | None = None, interactive: bool = False) -> int:
    """Run the training of ``rd`` in this allocation, restarting it after failures; the job's exit status.
    ``interactive``: from a shell in the allocation (cluster.submit=here) rather than a job's batch step."""
    return Supervisor(rd, os.environ if environ is None else environ, interactive).run()


def run(run_dir: str | Path) -> None:
    """The call submitit pickles: supervise, and end the job with the supervisor's status."""
    code = supervise(RunDir(Path(run_dir)))
    if code:
        sys.stdout.flush()
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """``python -m hpc_train.supervisor --run-dir RUN_DIR``, in the batch step of a job."""
    parser = argparse.ArgumentParser(prog="python -m hpc_train.supervisor", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory written by `python -m hpc_train`")
    args = parser.parse_args(argv)
    if not RunDir.holds_run(args.run_dir):
        parser.error(f"--run-dir {args.run_dir}: no {RunDir(args.run_dir).config.name} there")
    sys.exit(supervise(RunDir(args.run_dir)))


if __name__ == "__main__":
    main()
