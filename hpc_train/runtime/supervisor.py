"""In-allocation restart: the batch step supervises the training step and starts it again after a failure.

Every Slurm job of hpc_train runs this in its batch step (``python -m hpc_train.supervisor --run-dir RUN_DIR``
in the sbatch script, or the call submitit pickles). It picks ``cluster.nodes`` healthy nodes of the
allocation, runs the training step on them with srun (``python -m hpc_train.worker`` on every task) and waits.
When the step fails in a way worth retrying (``hpc_train.runtime.failures``), it starts a new step in the same
allocation: no new job, no queue wait. The ranks resume from the newest complete checkpoint. A packed job
(``cluster.pack``) runs ``--pack RUN_DIR...`` instead: one such supervisor per run dir (``runtime.pack``).

- Nodes blamed for the failure go on the run's bad-node list (``status/bad_nodes.json``); with
  ``cluster.slurm.spare_nodes`` or ``cluster.min_nodes`` the next attempt runs without them: on spares, else on
  fewer nodes (down to ``cluster.min_nodes``, with the same global batch), and when even that many healthy nodes
  are not left the job ends (ExitCode.GAVE_UP, 87). Without either the next attempt reuses the node.
- At most ``cluster.slurm.max_failures`` restarts per job, and at most ``cluster.slurm.max_stalled_failures`` failed
  attempts in a row without a new checkpoint; then the job ends (ExitCode.GAVE_UP, 87).
- A fatal failure (the same exception from the same step twice in a row, an import error, a config error)
  ends the job at once (ExitCode.FATAL, 86), with no retry and no requeue.
- A stop signal (preemption, the time limit, scancel) is the ranks' business: they checkpoint and requeue the
  job; the supervisor starts nothing more.

Every attempt is recorded in ``status/attempts.json`` and the goodput ledger in ``status/goodput.json``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from hpc_train.config import load_config
from hpc_train.config.shape import ASKED_VARIABLE, NODES_VARIABLE, Shape, fits_on, on_nodes
from hpc_train.core.errors import EXIT_FATAL, EXIT_GAVE_UP, ExitCode
from hpc_train.core.hostlist import expand_hostlist
from hpc_train.core.identity import JobIdentity
from hpc_train.core.records import AttemptOutcome, AttemptRecord, BadNode, RankStatus, Reshape
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import asked_for
from hpc_train.mirror.pull import StoryNotRestored, restore_story
from hpc_train.runtime.failures import CANCELLED, Failure, SrunReport, StepEnd, attempt_outcome
from hpc_train.runtime.grow import (
    checkpoint_cost_s,
    estimate,
    job_submit_time,
    larger_count,
    pending_jobs,
    requeue_gap_s,
    requeue_goes_behind,
)
from hpc_train.runtime.ledger import AttemptLedger
from hpc_train.runtime.pack import in_pack, member_srun_options, run_pack
from hpc_train.runtime.retry import RetryBudget, attempt_progressed, pick_nodes
from hpc_train.runtime.srun import SrunStep, say, step_argv
from hpc_train.runtime.timeouts import (
    KILL_WAIT_VARIABLE,
    derive_lead,
    job_end_time,
    kill_wait_s,
    measured,
    slurm_config,
    timeouts,
)
from hpc_train.tracking import ensure_runs
from hpc_train.train.stopping import StopSignals, signal_number

__all__ = ["EXIT_FATAL", "EXIT_GAVE_UP", "main", "pick_nodes", "run", "run_packed", "step_argv", "supervise"]

STOP_GRACE_S = 30
"""After a stop signal, how long srun gets beyond cluster.slurm.srun_wait_s before the supervisor ends it."""
"""The message of an attempt ended on a cancel request (a member of a pack, cancelled alone)."""
STRAGGLER_CHECK_S = 10.0
"""How often the supervisor reads the straggler verdicts, with ``cluster.stragglers.replace_after_s``."""
LAUNCH_GRACE_S = 120
"""How long, beyond trainer.preflight_timeout_s, a step may go without any rank writing its first status
before the supervisor ends srun (it never got its tasks running: a node that cannot start them, a step that
Slurm keeps waiting)."""


class Supervisor:
    """The loop: pick the nodes, run a training step, look at how it ended, and decide. The books are the
    ledger's (``runtime.ledger``), the limits the retry budget's (``runtime.retry``), srun's I/O
    ``runtime.srun``'s."""

    def __init__(self, rd: RunDir, environ: Mapping[str, str], interactive: bool = False) -> None:
        self.rd = rd
        self.interactive = interactive
        """Run from a shell in an allocation (cluster.slurm.submit=here): stop signals reach this process only, and
        are passed on to the training step."""
        self.environ = environ
        self.cfg = load_config(rd.config)
        self.cluster = self.cfg.cluster
        nodelist = environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise SystemExit("hpc_train.supervisor runs inside a Slurm job's batch step (SLURM_JOB_NODELIST unset)")
        self.allocation = expand_hostlist(nodelist)
        self.job = JobIdentity.from_environ(environ)
        self.ledger = AttemptLedger(rd, self.job, self.allocation)
        self.budget = RetryBudget.restarts(self.cluster)
        hangup = [signal.SIGHUP] if interactive else []  # the terminal that runs it closed
        self.signals = StopSignals([signal_number(self.cluster.signal), signal.SIGTERM, signal.SIGINT, *hangup])
        self.python = self.cluster.slurm.python or sys.executable
        self.asked = self._asked()
        """The node range the job asked Slurm for (None: a fixed count)."""
        self.grow_check_at = 0.0
        """When the growth check runs next (time.monotonic); inf once the step was told to stop and grow."""
        self.kill_wait = kill_wait_s()
        self.straggler_check_at = 0.0
        """When the supervisor next reads the straggler verdicts (``cluster.stragglers.replace_after_s``)."""
        self.stop_at: float | None = None
        """``signal_lead_s=auto``: when (time.time) this supervisor tells the step to stop, the lead derived for
        this attempt before the job's end; None: Slurm's own --signal does it (a fixed lead), or it was sent."""
        self.lead_s = 0
        """The signal lead of this attempt (``_arm_stop``)."""

    def _asked(self) -> tuple[int, int] | None:
        """The job record's --nodes (cluster.slurm.shape=earliest_finish may have asked for one count of the
        range), else the config's range; None for a job of a fixed count, and for an allocation a shell holds
        (its salloc asked, not hpc_train)."""
        if not self.cluster.asks_range or self.interactive:
            return None
        job = self.rd.job()
        low, _, high = (job.nodes if job is not None else "").partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            return int(low), int(high or low)
        return self.cluster.fewest_nodes, self.cluster.allocated_nodes

    def run(self) -> int:
        self.signals.install()
        self.rd.clear_restart_request()  # one an earlier allocation left: its step is long gone
        self.ledger.begin(self.asked)
        if self.asked is not None:
            say(f"{asked_for(*self.asked, len(self.allocation))} ({','.join(self.allocation)})", sys.stdout)
        # The tracker runs, if the submission could not create them (a sweep's elements, an unreachable server):
        # before the first attempt, so that a script's ranks get their ids.
        ensure_runs(self.rd, self.cfg)
        try:
            return self._loop()
        finally:
            self.ledger.end()
            self.signals.restore()

    def _loop(self) -> int:
        while True:
            number = self.ledger.next_number()
            last = self.ledger.last
            bad = [node.host for node in self.rd.bad_node_records()]
            nodes = pick_nodes(self.allocation, bad, self.cluster, lambda n: fits_on(self.cfg, n))
            if isinstance(nodes, str):
                return self._give_up(last if self.ledger.mine(last) else None, nodes)
            if self.signals.received:
                say(f"signal {self.signals.received} came before attempt {number}; not starting it")
                return 0
            if self.rd.cancel_requested():
                say(
                    f"cancelled by `python -m hpc_train.jobs cancel` ({self.rd.cancel_request}); not starting attempt {number}"
                )
                return 0
            entry = self._attempt(number, nodes)
            if entry.outcome is AttemptOutcome.COMPLETED:
                return 0
            if entry.message == CANCELLED:  # the step was ended on request: nothing to retry, nothing failed
                return 0
            if entry.outcome is AttemptOutcome.STOPPED:
                leaving = self.rd.restart_requested()
                if leaving is None or self.signals.received:
                    return entry.exit_code or 0
                self.rd.clear_restart_request()
                say(
                    f"attempt {number} stopped to leave {leaving.host} ({leaving.why}); starting attempt {number + 1} in this allocation"
                )
                continue
            failure = entry.failure
            assert failure is not None  # an attempt that neither completed nor stopped failed
            if not failure.retryable:
                self.ledger.save(replace(entry, outcome=AttemptOutcome.FATAL))
                say(f"fatal failure, not retried and not requeued (exit {ExitCode.FATAL}): {failure.describe()}")
                return ExitCode.FATAL
            why_not = self._refusal()
            if why_not is not None:
                return self._give_up(entry, why_not)
            if self.cluster.slurm.spare_nodes or self.cluster.asks_range:
                for host in [h for h in failure.suspects if h in self.allocation]:
                    self.rd.add_bad_node(host, failure.describe(), number)
            say(f"attempt {number} failed ({failure.describe()}); starting attempt {number + 1} in this allocation")

    def _attempt(self, number: int, nodes: list[str]) -> AttemptRecord:
        self.rd.clear_statuses()
        entry = AttemptRecord(
            attempt=number,
            job_id=self.job.allocation[0],
            requeue=self.job.requeues,
            nodes=tuple(nodes),
            ranks=len(nodes) * self.cluster.ranks_per_node,
            start=time.time(),
            outcome=AttemptOutcome.RUNNING,
            script=self.cfg.script.enabled,
        )
        self.ledger.save(entry)
        argv = step_argv(self.rd, self.cluster, nodes, self.python, member_srun_options(self.cluster, self.environ))
        say(f"attempt {number} on {','.join(nodes)}: {shlex.join(argv)}", sys.stdout)
        self._arm_stop()
        environ = {**self.environ, **self.job.for_attempt(number).environ(), **self._shape(number, nodes)}
        if self.kill_wait is not None:
            environ[KILL_WAIT_VARIABLE] = str(self.kill_wait)
        step = SrunStep(argv, environ, forward_stop=self._forwarded(), hasty=self.interactive)
        launch_s = self.cfg.trainer.preflight_timeout_s + LAUNCH_GRACE_S
        try:
            self.grow_check_at = time.monotonic() + self.cluster.slurm.grow_every_min * 60
            code = step.wait(
                self.signals,
                grace_s=self.cluster.slurm.srun_wait_s + STOP_GRACE_S,
                started=functools.partial(self._started, number),
                launch_s=launch_s,
                cancelled=self.rd.cancel_requested,
                tick=functools.partial(self._tick, step, number, nodes),
            )
        finally:
            if step.proc.poll() is None:  # this process is going away: its step (own session, maybe) goes too
                step.end()
        entry = replace(entry, end=time.time(), exit_code=code, progress=self.rd.progress_record(0))
        attempts = self.ledger.attempts
        ended = attempt_outcome(
            StepEnd(
                statuses=self._statuses(number),
                ranks=entry.ranks or 0,
                exit_code=code,
                srun=SrunReport.parse(step.lines),
                stop_signal=signal_number(self.cluster.signal),
                signalled=bool(self.signals.received),
                cancelled=self.rd.cancel_requested(),
                launch_timeout_s=launch_s if step.launch_timed_out else None,
                previous=attempts[-2].failure if len(attempts) > 1 else None,
            )
        )
        entry = replace(entry, outcome=ended.outcome, failure=ended.failure, message=ended.message or entry.message)
        if ended.failure is not None:
            _log_failure(ended.failure)
        self.ledger.save(entry)
        return entry

    def _shape(self, number: int, nodes: list[str]) -> dict[str, str]:
        """Say and record (``status/reshapes.json``) an attempt on another node count than the attempt before it
        (the run's first: than cluster.nodes), and tell the ranks of one on fewer than cluster.nodes how many
        (they keep the global batch); {} for an attempt on cluster.nodes. The count changes when nodes are lost
        (down to cluster.min_nodes), and when a job that asks for a range is given another count."""
        before = self._nodes_before(number)
        if len(nodes) != before:
            was, onto = (Shape.of(on_nodes(self.cfg, n)).describe() for n in (before, len(nodes)))
            lost = sorted({n.host for n in self.rd.bad_node_records()} & set(self.allocation))
            job = self.job.allocation[0]
            if lost and len(nodes) < before:
                why = (
                    f"attempt {number} in job {job} without {','.join(lost)}, no spare "
                    f"left (cluster.min_nodes={self.cluster.min_nodes})"
                )
            elif self.asked is not None:
                asked = asked_for(*self.asked, len(self.allocation))
                why = f"attempt {number} in job {job}, which {asked} (cluster.min_nodes={self.cluster.min_nodes})"
            else:
                why = f"attempt {number} in job {job}, on {len(nodes)} of its {len(self.allocation)} nodes"
            say(f"training on {len(nodes)} of {self.cluster.nodes} nodes: {onto}, was {was}; {why}")
            self.rd.append_reshape(Reshape(was=was, onto=onto, time=time.time(), why=why))
        told = {} if self.asked is None else {ASKED_VARIABLE: asked_for(*self.asked, len(self.allocation))}
        return told if len(nodes) == self.cluster.nodes else {**told, NODES_VARIABLE: str(len(nodes))}

    def _nodes_before(self, number: int) -> int:
        """The node count of the attempt before attempt ``number``, unless the run was resubmitted on another
        shape since (that change is recorded already) or has none; then cluster.nodes."""
        last = next((a for a in reversed(self.ledger.attempts) if a.attempt < number), None)
        ranks_per_node = self.cluster.ranks_per_node
        if last is None or not last.ranks or last.ranks % ranks_per_node:
            return self.cluster.nodes
        if not fits_on(self.cfg, last.ranks // ranks_per_node) or last.ranks > self.cluster.world_size:
            return self.cluster.nodes
        ended = last.end or last.start or 0.0
        if any((r.time or 0.0) > ended for r in self.rd.reshape_records()):
            return self.cluster.nodes
        return last.ranks // ranks_per_node

    def _arm_stop(self) -> None:
        """Before each attempt: say its timeout hierarchy (``runtime.timeouts``), with a warning for each pair
        its measurements show inverted, and forget the last attempt's straggler decision. With
        ``signal_lead_s=auto``, derive the lead from the measurements and arm this supervisor's own stop signal
        that long before the job's end: Slurm's --signal keeps the lead of the submission, through every
        requeue, and this attempt may know better."""
        found = measured(self.rd, self.ledger.attempts)
        lead = derive_lead(self.cfg, found)
        self.lead_s = lead.seconds
        hierarchy = timeouts(self.cfg, found, self.kill_wait, lead)
        for line in hierarchy.lines():
            say(line, sys.stdout)
        for warning in hierarchy.warnings():
            say(f"WARNING: {warning}")
        self.stop_at = None
        self.straggler_check_at = 0.0  # each attempt may leave one slow node
        self.rd.clear_restart_request()  # one an attempt that then failed did not consume: not for this one
        if not lead.auto or self.interactive or in_pack(self.environ):
            return
        ends = job_end_time(self.job.allocation[0])
        if ends is None:
            say(
                f"signal_lead_s=auto: Slurm did not say when job {self.job.allocation[0]} ends; its own --signal stands"
            )
            return
        self.stop_at = ends - lead.seconds
        say(
            f"signal_lead_s=auto: the step is told to stop at {time.strftime('%H:%M:%S', time.localtime(self.stop_at))}, "
            f"{lead.seconds} s before the job's end",
            sys.stdout,
        )

    def _tick(self, step: SrunStep, number: int, nodes: list[str]) -> None:
        """About once a second while the step runs: the growth check, a slow node to leave, and the stop of
        ``_arm_stop``."""
        self._maybe_grow(step, number, nodes)
        self._maybe_leave_straggler(step, number, nodes)
        if self.stop_at is not None and time.time() >= self.stop_at:
            self.stop_at = None
            say(f"signal_lead_s=auto: the job ends in {self._left_s():.0f} s; telling the step to stop", sys.stdout)
            self._tell_to_stop(step)

    def _maybe_leave_straggler(self, step: SrunStep, number: int, nodes: list[str]) -> None:
        """Every STRAGGLER_CHECK_S with ``cluster.stragglers.replace_after_s``: once a rank of this attempt has been
        named a straggler for that long, and the allocation can go on without its node (a spare, or a range),
        blame the node and stop the step; its ranks checkpoint without requeueing, and ``_loop`` starts the
        next attempt here."""
        after = self.cluster.stragglers.replace_after_s
        if not after or self.interactive or in_pack(self.environ) or time.monotonic() < self.straggler_check_at:
            return
        self.straggler_check_at = time.monotonic() + STRAGGLER_CHECK_S
        reports = self.rd.straggler_reports()
        began = self.ledger.last.start if self.ledger.last is not None else None
        if not reports or reports[-1].time < (began or 0.0):
            return
        now = time.time()
        slow = [r for r in reports[-1].ranks if r.host in nodes and r.since_time and now - r.since_time >= after]
        if not slow:
            return
        worst = slow[0]  # (slowest first)
        left = self._left_s()
        if left < 2 * self.lead_s:  # (NaN: Slurm did not say, and the node is left)
            # The job's own stop is due before a next attempt here could train: leaving the node now would only
            # meet it in the middle of the restart, and the requeue starts afresh anyway.
            say(
                f"straggler {worst.describe()}: the job ends in {left:.0f} s, within twice the signal lead "
                f"({self.lead_s} s); {worst.host} stays until the job's own stop",
                sys.stdout,
            )
            self.straggler_check_at = math.inf
            return
        bad = [node.host for node in self.rd.bad_node_records()]
        if isinstance(
            pick_nodes(self.allocation, [*bad, worst.host], self.cluster, lambda n: fits_on(self.cfg, n)), str
        ):
            say(f"straggler {worst.describe()}: no node to replace {worst.host} with; it stays", sys.stdout)
            self.straggler_check_at = math.inf
            return
        why = f"straggler: {worst.describe()}, slow for {now - (worst.since_time or now):.0f} s"
        self.rd.add_bad_node(worst.host, why, number)
        self.rd.request_restart(BadNode(host=worst.host, why=why, attempt=number))
        self.straggler_check_at = math.inf
        say(f"{why} (cluster.stragglers.replace_after_s={after:g}): stopping the step; the next attempt leaves it out")
        self._tell_to_stop(step)

    def _tell_to_stop(self, step: SrunStep) -> None:
        """cluster.signal to srun, which passes it on to every task: the ranks checkpoint at the next step and
        stop (growth, a straggler's node to leave, the lead ``auto`` derived)."""
        step.proc.send_signal(signal_number(self.cluster.signal))

    def _left_s(self) -> float:
        ends = job_end_time(self.job.allocation[0])
        return max(0.0, ends - time.time()) if ends is not None else math.nan

    def _maybe_grow(self, step: SrunStep, number: int, nodes: list[str]) -> None:
        """Every cluster.slurm.grow_every_min minutes of an attempt on fewer nodes than the range allows: when
        more would start at once and the work left pays for the move, tell the step to stop (its ranks
        checkpoint and requeue the job, which asks for the range again) and record why (``runtime.grow``)."""
        if time.monotonic() < self.grow_check_at or not self._may_grow(len(nodes)):
            return
        self.grow_check_at = time.monotonic() + self.cluster.slurm.grow_every_min * 60
        job = self.rd.job()
        script = Path(job.script if job is not None else "")
        progress = self.rd.progress_record(0)
        began = self.ledger.last.start if self.ledger.last is not None else None
        if not script.is_file() or (progress.first_time or 0.0) < (began or 0.0):
            return  # no script to ask Slurm about, or no step of this attempt yet
        count = larger_count(self.cfg, script, self.allocation, len(nodes))
        if count is None:
            say(f"growth check: no more nodes than {len(nodes)} would start at once", sys.stdout)
            return
        behind = self._queued_behind_after_requeue()
        if behind is not None:
            say(f"growth check: {count} nodes would start at once, but {behind}: not growing", sys.stdout)
            return
        gap, checkpoint = requeue_gap_s(self.ledger.allocations), checkpoint_cost_s(self.rd.requeue_records())
        found = estimate(self.cfg, self.ledger.attempts, progress, (len(nodes), count), gap, checkpoint)
        if found is None:
            say(f"growth check: {count} nodes would start at once, but this attempt has no step time yet", sys.stdout)
            return
        say(f"growth check: {found.describe()}", sys.stdout)
        if not found.worth:
            return
        self.ledger.add_growth(found.record(self.job.allocation[0], number, found.step, time.time()))
        self.grow_check_at = math.inf
        self._tell_to_stop(step)

    def _queued_behind_after_requeue(self) -> str | None:
        """Why a requeue now would send this job behind jobs that wait for nodes (and could take its own): other
        jobs wait in its partition, and on this Slurm a requeued job queues again behind them. None: it would not,
        as far as Slurm says."""
        job_id = self.job.allocation[0]
        starts = [a.start for a in self.ledger.allocations if a.job_id == job_id]
        behind, why = requeue_goes_behind(
            slurm_config("SLURM_VERSION"), job_submit_time(job_id), min(starts, default=None), self.job.requeues > 0
        )
        partition = self.environ.get("SLURM_JOB_PARTITION", "")
        if not behind or not partition:
            return None
        waiting = pending_jobs(partition, job_id)
        if not waiting:
            return None
        return (
            f"other jobs wait in partition {partition} ({len(waiting)}: {', '.join(waiting[:5])}) and a requeued job "
            f"would queue behind them, its nodes free for them ({why})"
        )

    def _may_grow(self, training: int) -> bool:
        """This job may come back larger: it asked for a range that holds more than ``training`` nodes, checks
        are on, it is a batch job of its own (not an allocation a shell holds, nor a pack's member) and its
        requeue budget is not spent."""
        slurm = self.cluster.slurm
        return (
            self.asked is not None
            and training < min(self.cluster.nodes, self.asked[1] - slurm.spare_nodes)
            and slurm.grow_every_min > 0
            and not self.interactive
            and not in_pack(self.environ)
            and self.job.requeues < slurm.max_restarts
        )

    def _forwarded(self) -> int:
        """From a shell (cluster.slurm.submit=here), a stop reaches only this process: it passes cluster.signal on.
        So does a pack's member, which the pack's supervisor tells to stop when another member stopped to be
        requeued."""
        return signal_number(self.cluster.signal) if self.interactive or in_pack(self.environ) else 0

    def _started(self, attempt: int) -> bool:
        """Some rank of ``attempt`` has written its status: the step launched."""
        return bool(self._statuses(attempt))

    def _statuses(self, attempt: int) -> dict[int, RankStatus]:
        """The ranks' statuses from this attempt: a rank of an earlier one that outlived its step (on a node
        cut off from Slurm) may still write its own."""
        return {r: s for r, s in self.rd.rank_statuses().items() if s.attempt in (None, attempt)}

    def _refusal(self) -> str | None:
        """Why the failure that just ended an attempt is not retried: the restart budget is spent."""
        here = self.ledger.failures_here()
        # An attempt that did not fail (it completed, stopped or was lost) ends a run of stalled failures.
        progress = [True if a.failure is None else attempt_progressed(a) for a in self.ledger.attempts]
        spent = self.budget.spent(len(here) - 1, progress)
        if spent is None:
            return None
        if not spent.stalled:
            return (
                f"not restarted: {len(here)} failures in this job (cluster.slurm.max_failures={self.cluster.slurm.max_failures})."
                " HINT: look at the failures in `python -m hpc_train.jobs status`; raise cluster.slurm.max_failures, or"
                " resubmit: the run dir resumes from its last checkpoint"
            )
        return (
            f"not restarted: the last {spent.count} attempts failed without saving a new checkpoint "
            f"(cluster.slurm.max_stalled_failures={self.cluster.slurm.max_stalled_failures}). HINT: checkpoint more often "
            "(trainer.checkpoint_every_n_steps) or fix what fails"
        )

    def _give_up(self, entry: AttemptRecord | None, why: str) -> int:
        say(f"giving up (exit {ExitCode.GAVE_UP}): {why}")
        if entry is not None:
            self.ledger.save(replace(entry, outcome=AttemptOutcome.GAVE_UP, message=why))
        return ExitCode.GAVE_UP


def _log_failure(failure: Failure) -> None:
    say(f"the training step failed: {failure.describe()}")
    if failure.traceback:
        tail = "\n".join(failure.traceback.strip().splitlines()[-8:])
        print(tail, file=sys.stderr, flush=True)


def supervise(rd: RunDir, environ: Mapping[str, str] | None = None, interactive: bool = False) -> int:
    """Run the training of ``rd`` in this allocation, restarting it after failures; the job's exit status.
    ``interactive``: from a shell in the allocation (cluster.slurm.submit=here) rather than a job's batch step."""
    return Supervisor(rd, os.environ if environ is None else environ, interactive).run()


def run(run_dir: str | Path) -> None:
    """The call submitit pickles: supervise, and end the job with the supervisor's status."""
    code = supervise(RunDir(Path(run_dir)))
    if code:
        sys.stdout.flush()
        raise SystemExit(code)


def run_packed(run_dirs: list[str]) -> None:
    """The call submitit pickles for a pack (``cluster.pack``): its members side by side, and the job's status."""
    code = run_pack(run_dirs)
    if code:
        sys.stdout.flush()
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """``python -m hpc_train.supervisor --run-dir RUN_DIR`` (or ``--pack RUN_DIR...``), in the batch step of a
    job."""
    parser = argparse.ArgumentParser(prog="python -m hpc_train.supervisor", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-dir", type=Path, help="run directory written by `python -m hpc_train`")
    which.add_argument("--pack", type=Path, nargs="+", help="the run directories of a pack (cluster.pack)")
    parser.add_argument(
        "--mirror",
        default="",
        help="the run's trainer.mirror: a run dir that lost its config.yaml (a scratch purge while the job was "
        "queued) gets its story back from there first, and the ranks resume from the mirror's newest checkpoint",
    )
    args = parser.parse_args(argv)
    if args.mirror and args.run_dir:
        try:
            restore_story(RunDir(args.run_dir), args.mirror, lambda line: say(line, sys.stdout))
        except StoryNotRestored as exc:
            say(f"ERROR: {exc}")
            sys.exit(ExitCode.FATAL)
    for path in args.pack or [args.run_dir]:
        if not RunDir.holds_run(path):
            parser.error(f"{path}: no {RunDir(path).config.name} there")
    if args.pack:
        sys.exit(run_pack(args.pack))
    sys.exit(supervise(RunDir(args.run_dir)))


if __name__ == "__main__":
    main()
