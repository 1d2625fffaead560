"""A pack: several run dirs (points of a sweep, ``cluster.pack``) trained side by side in one Slurm job.

The pack's batch step runs ``python -m hpc_train.supervisor --pack RUN_DIR...``: one member supervisor per run
dir, each a child process that does exactly what the batch step of an unpacked job does (its attempts, its retry
budget, its ledger, its trackers). What differs for a member:

- Its training steps run with ``srun --exact`` and their own counts (``member_srun_options``): its tasks' CPUs,
  its GPUs and its share of the job's memory, so that the members' steps run at the same time instead of waiting
  for one another. Each step has its own step id, hence its own MASTER_PORT (``distributed.env.derive_port``).
- Its rank 0 does not requeue the job after a stop (``runtime.requeue.after_stop``): it says so in its status,
  and this process requeues once, when every member has stopped or finished. The first member that asks passes
  the stop on to the others, so that no member trains on into the time limit while the pack waits for it.
- After a requeue, the members that finished (completed, or ended by a fatal failure or a spent budget) are
  skipped; the others resume from their checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpc_train.config import ClusterConfig, load_config
from hpc_train.core.errors import ExitCode, LaunchError
from hpc_train.core.identity import PACK_VARIABLE, JobIdentity, in_pack
from hpc_train.core.records import AttemptOutcome, BatchExit, RankState
from hpc_train.core.rundir import RunDir
from hpc_train.runtime.commands import SUPERVISOR
from hpc_train.runtime.requeue import requeue
from hpc_train.runtime.srun import say
from hpc_train.train.stopping import StopSignals, signal_number

__all__ = ["PACK_VARIABLE", "in_pack", "member_srun_options", "run_pack"]

ENDED = (AttemptOutcome.COMPLETED, AttemptOutcome.FATAL, AttemptOutcome.GAVE_UP)
"""A member whose last attempt ended so has nothing left to do in a later allocation."""
POLL_S = 1.0


def member_srun_options(cluster: ClusterConfig, environ: Mapping[str, str]) -> list[str]:
    """The srun options that keep a member's step to its own share of the allocation ([] outside a pack):
    ``--exact`` (only its tasks' CPUs), its GPUs and its part of each node's memory. Without them a step may be
    given all of the job's CPUs, GPUs or memory, and the next member's step then waits for it to end. The step
    is named ``member<index>``."""
    pack = environ.get(PACK_VARIABLE, "")
    if not pack:
        return []
    index, size = (int(part) for part in pack.split("/"))
    options = ["--exact", f"--job-name=member{index}"]  # the step's name in squeue -s and sacct
    if cluster.gpus_per_node:
        if cluster.slurm.gpu_binding == "task":
            options.append("--gpus-per-task=1")
        else:
            options.append(f"--gpus-per-node={cluster.gpus_per_node}")
    node_mb = environ.get("SLURM_MEM_PER_NODE", "")
    if node_mb.isdigit() and int(node_mb) > 0:  # (a job that asked --mem-per-cpu: a step's follows its CPUs)
        options.append(f"--mem={int(node_mb) // size}M")
    return options


def _ended(rd: RunDir) -> str | None:
    """How the member ended, when that leaves it nothing to do (None: it trains on): its last attempt's
    outcome, or cancelled (``jobs cancel`` of this member alone)."""
    if rd.cancel_requested():
        return "cancelled"
    attempts = rd.attempt_records()
    outcome = attempts[-1].outcome if attempts else None
    return outcome.value if outcome in ENDED else None


def _wants_requeue(rd: RunDir, since: float) -> bool:
    """The member's rank 0 stopped on the preemption signal and asked for the job to be requeued, in this
    allocation (written after ``since``: a member that exits before its first attempt leaves the last
    allocation's status in place)."""
    status = rd.rank_statuses().get(0)
    if status is None or status.state is not RankState.STOPPED or not status.requeued:
        return False
    try:
        return rd.status_path(0).stat().st_mtime >= since
    except OSError:
        return False


class Pack:
    """The members of one pack and their supervisors."""

    def __init__(self, run_dirs: Sequence[Path], environ: Mapping[str, str]) -> None:
        self.members = [RunDir(Path(d)) for d in run_dirs]
        self.environ = environ
        self.cluster = load_config(self.members[0].config).cluster
        self.python = self.cluster.slurm.python or sys.executable
        self.stop = signal_number(self.cluster.signal)
        self.job = JobIdentity.from_environ(environ)

    def run(self) -> int:
        # A stop that reaches this process (scancel --full) reaches the members too: it is theirs to handle.
        signals = StopSignals([self.stop, signal.SIGTERM, signal.SIGINT]).install()
        try:
            return self._run()
        finally:
            signals.restore()

    def _run(self) -> int:
        started = time.time() - 1  # (file times may be coarser than this clock)
        running: dict[int, subprocess.Popen[bytes]] = {}
        for index, rd in enumerate(self.members):
            ended = _ended(rd)
            if ended is not None:
                say(f"pack member {index} ({rd.path}) has ended ({ended}); skipped")
                continue
            environ = {**self.environ, PACK_VARIABLE: f"{index}/{len(self.members)}"}
            argv = [*self.cluster.container_argv, self.python, "-u", "-m", SUPERVISOR, "--run-dir", str(rd.path)]
            running[index] = subprocess.Popen(argv, env=environ)
        say(f"pack of {len(self.members)}: {len(running)} member(s) started in job {self.job.slurm_job}")
        codes: dict[int, int] = {}
        passed_on = False
        # No deadline of its own: each member supervisor bounds its attempts, and Slurm's time limit the job.
        while running:
            time.sleep(POLL_S)
            for index, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                codes[index] = code
                del running[index]
                self._write_exit(self.members[index], code)
                say(f"pack member {index} ({self.members[index].path}) exited with status {code}")
            requeue_asked = any(_wants_requeue(self.members[i], started) for i in codes)
            if requeue_asked and running and not passed_on:
                # One member stopped to be requeued: the others stop too (checkpoint first), so that the job is
                # requeued now rather than when the last of them would have finished.
                say(f"a member stopped to be requeued; passing SIG{self.cluster.signal} on to the members left")
                for proc in running.values():
                    proc.send_signal(self.stop)
                passed_on = True
        if any(_wants_requeue(self.members[i], started) for i in codes) and self.job.slurm_job:
            say(f"every member stopped or finished; requeueing {self.job.slurm_job} once")
            try:
                requeue(self.job.slurm_job)
            except LaunchError as exc:
                say(f"{exc}. The members' checkpoints are kept: resubmit the sweep's run dirs to resume")
                return ExitCode.FAILED
            return 0
        return next((code for code in codes.values() if code), 0)

    def _write_exit(self, rd: RunDir, code: int) -> None:
        """The member's ``status/batch_exit.json``, as an unpacked job's teardown writes it."""
        record = BatchExit(job_id=self.environ.get("SLURM_JOB_ID", ""), exit_code=code, end=int(time.time()))
        try:
            rd.write_batch_exit(record)
        except OSError as exc:
            say(f"could not write {rd.batch_exit}: {exc}")


def run_pack(run_dirs: Sequence[str | Path], environ: Mapping[str, str] | None = None) -> int:
    """Train the pack's run dirs side by side in this allocation; the job's exit status."""
    return Pack([Path(d) for d in run_dirs], os.environ if environ is None else environ).run()
