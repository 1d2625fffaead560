"""The timeout hierarchy of a run: every limit that decides whether a stop saves its checkpoint, in one place.

A Slurm job ends at its time limit. ``cluster.slurm.signal_lead_s`` before it, the ranks get ``cluster.signal``:
each finishes its step, rank 0 writes the checkpoint, the job requeues itself. That works only in one order:

- the lead must cover a step and a checkpoint write (and the exit), or the time limit kills the ranks while
  they save (Slurm then sends SIGTERM, and SIGKILL ``KillWait`` seconds later); Slurm may send the signal up
  to SLURM_EARLY_S earlier than asked, never later;
- the lead must be at least srun's grace (``cluster.slurm.srun_wait_s``), the longest a stop may take once
  its first rank has ended (refused before submission: ``SlurmConfig._check_lead``);
- the watchdog (``trainer.watchdog_s``) must outlast the slowest checkpoint, or it fires in the middle of
  one; so must the process-group timeout (``trainer.dist_timeout_s``) when checkpoints are synchronous, since
  the other ranks wait for rank 0's write in a collective.

What depends on a measurement (a step, a checkpoint, a stop: ``Measured``, from the run dir's attempts and
stops) is warned about with the numbers; ``signal_lead_s=auto`` derives the lead from it (``derive_lead``).
``Timeouts.lines`` is the block the launcher prints before a submission and the supervisor at each attempt.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from hpc_train.config import Config
from hpc_train.core.goodput import step_seconds
from hpc_train.core.records import AttemptRecord
from hpc_train.core.rundir import RunDir

__all__ = [
    "AUTO_DEFAULT_LEAD_S",
    "EXIT_ALLOWANCE_S",
    "KILL_WAIT_VARIABLE",
    "LEAD_FACTOR",
    "SLURM_EARLY_S",
    "Lead",
    "Measured",
    "Timeouts",
    "derive_lead",
    "job_end_time",
    "kill_wait_s",
    "log_timeouts",
    "measured",
    "slurm_config",
    "timeouts",
]

AUTO_DEFAULT_LEAD_S = 90
"""The lead ``signal_lead_s=auto`` gives a run with nothing measured yet (the default fixed lead)."""
LEAD_FACTOR = 2.0
"""``auto``: the lead covers this many times the slowest stop measured..."""
EXIT_ALLOWANCE_S = 30
"""...plus this, for rank 0's final status, the requeue and srun's exit."""
SLURM_EARLY_S = 60
"""Slurm may send the --signal up to this much before the lead asked for (its timer runs once a minute)."""
WATCHDOG_FACTOR = 2.0
"""A watchdog or process-group timeout shorter than this many checkpoints is warned about."""
SCONTROL_TIMEOUT_S = 30
KILL_WAIT_VARIABLE = "HPC_TRAIN_KILL_WAIT_S"
"""Slurm's KillWait as the supervisor read it, for rank 0's copy of the hierarchy (ranks do not ask Slurm)."""


def slurm_config(name: str) -> str | None:
    """One value of ``scontrol show config`` as Slurm prints it (``KillWait`` -> ``30 sec``); None where Slurm
    does not answer, or does not have it."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(rf"^{re.escape(name)}\s*=\s*(.*?)\s*$", out, re.MULTILINE)
    return found.group(1) if found else None


def kill_wait_s() -> int | None:
    """Slurm's KillWait: at the time limit (or a cancel) the ranks get SIGTERM, and SIGKILL this many seconds
    later. None where Slurm does not answer."""
    value = slurm_config("KillWait")
    found = re.match(r"(\d+)", value or "")
    return int(found.group(1)) if found else None


def job_end_time(job_id: str) -> float | None:
    """When Slurm will end the running job ``job_id`` (its start and time limit: ``squeue``'s %e), as a time
    stamp; None where Slurm does not answer or sets none."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%e"],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return datetime.fromisoformat(out.splitlines()[0]).timestamp() if out else None
    except ValueError:  # "N/A", "Unknown"
        return None


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What the run dir's attempts measured (None: not yet)."""

    step_s: float | None = None
    """The latest attempt's mean step (of those that made two steps or more)."""
    checkpoint_s: float | None = None
    """The slowest checkpoint, from its save's start until it was durable."""
    stop_s: float | None = None
    """The slowest stop: from the signal until its checkpoint was durable (``status/restarts.json``)."""

    @property
    def stop_need_s(self) -> float | None:
        """What a stop takes: the slowest measured, or a step and the slowest checkpoint, whichever is more."""
        parts = [self.stop_s, (self.step_s or 0.0) + self.checkpoint_s if self.checkpoint_s is not None else None]
        known = [p for p in parts if p is not None]
        return max(known) if known else None

    def describe(self) -> str:
        """'a step 0.52 s (latest mean), a checkpoint 12.3 s, a stop 13.1 s (slowest measured in this run dir)',
        or what is not measured yet."""
        named = [f"a step {_seconds(self.step_s)} (latest mean)"] if self.step_s is not None else []
        named += [
            f"{what} {_seconds(value)}"
            for what, value in (("a checkpoint", self.checkpoint_s), ("a stop", self.stop_s))
            if value is not None
        ]
        if not named:
            return "not measured yet (a first run)"
        return ", ".join(named) + (" (slowest measured in this run dir)" if len(named) > 1 or not self.step_s else "")


def measured(rd: RunDir, attempts: Sequence[AttemptRecord] | None = None) -> Measured:
    """The step, checkpoint and stop times the run dir holds; ``attempts``: its attempts, where the caller keeps
    them (the supervisor's ledger) and the file need not be read again."""
    attempts = rd.attempt_records() if attempts is None else attempts
    steps = [s for s in (step_seconds(a.progress) for a in attempts) if s]
    saves = [a.progress.checkpoint_s for a in attempts if a.progress is not None and a.progress.checkpoint_s]
    # A resubmitted run dir's attempts (local runs, or before the supervisor's ledger) leave rank 0's progress.
    latest = rd.progress_record(0)
    if latest.checkpoint_s:
        saves.append(latest.checkpoint_s)
    if not steps and step_seconds(latest):
        steps.append(step_seconds(latest) or 0.0)
    stops = [e.stop_saved_s for e in rd.requeue_records() if e.stop_saved_s is not None]
    return Measured(
        step_s=steps[-1] if steps else None,
        checkpoint_s=max(saves) if saves else None,
        stop_s=max(stops) if stops else None,
    )


@dataclass(frozen=True, kw_only=True)
class Lead:
    """The signal lead in force, and where it comes from."""

    seconds: int
    source: str
    """'cluster.slurm.signal_lead_s=90', or how ``auto`` derived it."""
    auto: bool = False


def derive_lead(cfg: Config, found: Measured) -> Lead:
    """The lead for ``cfg``: the one it sets, or with ``auto`` LEAD_FACTOR times the stop measured plus
    EXIT_ALLOWANCE_S (AUTO_DEFAULT_LEAD_S with nothing measured), at least srun's grace and under half the time
    limit."""
    slurm = cfg.cluster.slurm
    fixed = slurm.fixed_lead_s
    if not slurm.lead_auto and fixed is not None:
        return Lead(seconds=fixed, source=f"cluster.slurm.signal_lead_s={fixed}")
    need = found.stop_need_s
    if need is None:
        seconds, why = AUTO_DEFAULT_LEAD_S, f"nothing measured yet: the default {AUTO_DEFAULT_LEAD_S} s"
    else:
        seconds = math.ceil(LEAD_FACTOR * need + EXIT_ALLOWANCE_S)
        why = f"{LEAD_FACTOR:g} x the stop measured ({_seconds(need)}) + {EXIT_ALLOWANCE_S} s"
    if seconds < slurm.srun_wait_s:
        seconds, why = slurm.srun_wait_s, f"{why}, raised to srun's grace (cluster.slurm.srun_wait_s)"
    ceiling = min(0xFFFF, int(cfg.cluster.timeout_min * 60 / 2))
    if seconds > ceiling:
        seconds, why = ceiling, f"{why}, cut to half the time limit"
    return Lead(seconds=seconds, source=f"signal_lead_s=auto: {why}", auto=True)


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """A run's timeouts, shortest guard first, with what they were measured against."""

    slurm: bool
    time_limit_s: float
    signal: str
    lead: Lead | None
    """None off Slurm, and in an allocation a shell holds: no signal of ours comes before the time limit."""
    found: Measured
    checkpoint_async: bool
    watchdog_s: float
    dist_timeout_s: float
    status_every_s: float
    grace_s: float
    grace_key: str
    kill_wait_s: int | None = None
    mirror_wait_s: float | None = None
    """How long a stop waits for the last copy to trainer.mirror (None: no mirror)."""

    def lines(self) -> list[str]:
        """The hierarchy in one block."""
        rows = [("time limit", f"{_seconds(self.time_limit_s)} (cluster.timeout_min)")]
        if self.lead is not None:
            rows.append(
                (
                    "stop signal",
                    f"{self.signal} {self.lead.seconds} s before it ({self.lead.source}; Slurm may send it up to "
                    f"{SLURM_EARLY_S} s earlier)",
                )
            )
        writes = "in the background" if self.checkpoint_async else "synchronous"
        rows.append(("step, checkpoint", f"{self.found.describe()}; checkpoints {writes}"))
        if self.mirror_wait_s is not None:
            rows.append(
                (
                    "mirror",
                    f"a stop waits {_seconds(self.mirror_wait_s)} at most for the last copy (trainer.mirror_wait_s)",
                )
            )
        rows.append(("watchdog", f"{_seconds(self.watchdog_s)} (trainer.watchdog_s)" if self.watchdog_s else "off"))
        rows.append(("process group", f"{_seconds(self.dist_timeout_s)} (trainer.dist_timeout_s)"))
        rows.append(("node status", f"every {_seconds(self.status_every_s)} (cluster.status_every_s)"))
        rows.append(("grace", f"{_seconds(self.grace_s)} for the others once a rank ended ({self.grace_key})"))
        if self.slurm:
            kill = "not known here (Slurm did not answer)" if self.kill_wait_s is None else f"{self.kill_wait_s} s"
            rows.append(("KillWait", f"{kill}: from SIGTERM at the time limit to SIGKILL"))
        width = max(len(name) for name, _ in rows)
        return ["timeouts:", *(f"  {name:<{width}}  {value}" for name, value in rows)]

    def warnings(self) -> list[str]:
        """The pairs that a measurement shows inverted, each with its numbers and the fix."""
        found, out = self.found, []
        need = found.stop_need_s
        if self.lead is not None and need is not None and self.lead.seconds < need:
            kill = f"; Slurm then gives KillWait ({self.kill_wait_s} s) before SIGKILL" if self.kill_wait_s else ""
            out.append(
                f"the stop signal comes {self.lead.seconds} s before the time limit ({self.lead.source}), but a stop "
                f"in this run dir took {_seconds(need)} ({found.describe()}): a preemption's checkpoint may not be "
                f"durable before the time limit{kill}. HINT: cluster.slurm.signal_lead_s=auto, or at least "
                f"{math.ceil(LEAD_FACTOR * need + EXIT_ALLOWANCE_S)}"
            )
        slowest = found.checkpoint_s
        if slowest is not None and self.watchdog_s and self.watchdog_s < WATCHDOG_FACTOR * slowest:
            out.append(
                f"trainer.watchdog_s={self.watchdog_s:g} is less than {WATCHDOG_FACTOR:g} x the slowest checkpoint "
                f"measured ({_seconds(slowest)}): the watchdog may fire while one is written. HINT: "
                f"trainer.watchdog_s={math.ceil(WATCHDOG_FACTOR * slowest)} or more"
            )
        if slowest is not None and not self.checkpoint_async and self.dist_timeout_s < WATCHDOG_FACTOR * slowest:
            out.append(
                f"trainer.dist_timeout_s={self.dist_timeout_s:g} is less than {WATCHDOG_FACTOR:g} x the slowest "
                f"checkpoint measured ({_seconds(slowest)}): the other ranks wait for rank 0's write in a "
                f"collective, which may time out. HINT: trainer.dist_timeout_s="
                f"{math.ceil(WATCHDOG_FACTOR * slowest)} or more, or trainer.checkpoint_async=true"
            )
        if self.lead is not None and self.mirror_wait_s is not None and self.mirror_wait_s >= self.lead.seconds:
            out.append(
                f"trainer.mirror_wait_s={self.mirror_wait_s:g} is not shorter than the stop signal's lead "
                f"({self.lead.seconds} s): at the time limit, Slurm may end the job while it waits for the mirror's "
                "last copy (the checkpoint is safe in the run dir; the mirror then holds the one before). HINT: "
                f"trainer.mirror_wait_s={max(1, self.lead.seconds // 3)}, or a longer cluster.slurm.signal_lead_s"
            )
        if self.watchdog_s and self.watchdog_s >= self.time_limit_s:
            out.append(
                f"trainer.watchdog_s={self.watchdog_s:g} is not shorter than the time limit "
                f"({_seconds(self.time_limit_s)}): a hung rank holds the job until Slurm ends it. HINT: "
                "a watchdog of a fraction of the time limit, e.g. trainer.watchdog_s=900"
            )
        return out


def log_timeouts(cfg: Config, rd: RunDir, environ: Mapping[str, str], log: logging.Logger) -> None:
    """Rank 0: the hierarchy in its log, as its supervisor said it (KillWait from ``KILL_WAIT_VARIABLE``)."""
    value = environ.get(KILL_WAIT_VARIABLE, "")
    hierarchy = timeouts(cfg, measured(rd), int(value) if value.isdigit() else None)
    log.info("%s", "\n".join(hierarchy.lines()))
    for warning in hierarchy.warnings():
        log.warning("%s", warning)


def timeouts(cfg: Config, found: Measured, kill_wait: int | None = None, lead: Lead | None = None) -> Timeouts:
    """The hierarchy of ``cfg`` against what the run measured (``measured``); ``lead``: the one in force, when
    the caller derived it already."""
    cluster, trainer = cfg.cluster, cfg.trainer
    slurm = cluster.launcher == "slurm"
    return Timeouts(
        slurm=slurm,
        time_limit_s=cluster.timeout_min * 60,
        signal=cluster.signal.upper().removeprefix("SIG"),
        # An allocation a shell holds (submit=here) has no --signal of ours: its time limit is salloc's.
        lead=(lead or derive_lead(cfg, found)) if slurm and cluster.slurm.submit != "here" else None,
        found=found,
        checkpoint_async=trainer.checkpoint_async,
        watchdog_s=trainer.watchdog_s,
        dist_timeout_s=trainer.dist_timeout_s,
        status_every_s=cluster.status_every_s,
        grace_s=cluster.slurm.srun_wait_s if slurm else cluster.failure_grace_s,
        grace_key="cluster.slurm.srun_wait_s" if slurm else "cluster.failure_grace_s",
        kill_wait_s=kill_wait,
        mirror_wait_s=(
            mirror_wait_s(cfg, cluster.nodes * cluster.tasks_per_node)
            if trainer.mirror or trainer.mirror_hook
            else None
        ),
    )


SRUN_MARGIN_S = 15.0
"""On Slurm with other ranks, rank 0's wait for the mirror ends this long before srun's grace would kill it (the
other ranks end at once, and srun gives the last one cluster.slurm.srun_wait_s): the requeue after the wait must
still run."""


def mirror_wait_s(cfg: Config, world_size: int) -> float:
    """How long rank 0 waits for the mirror's last copy at a stop: trainer.mirror_wait_s, within srun's grace on
    Slurm when other ranks run."""
    wait = cfg.trainer.mirror_wait_s
    if cfg.cluster.launcher == "slurm" and world_size > 1:
        wait = min(wait, max(cfg.cluster.slurm.srun_wait_s - SRUN_MARGIN_S, 0.0))
    return wait


def _seconds(value: float) -> str:
    """12.3 s, 15 min, 2 h."""
    if value >= 7200 and value % 3600 == 0:
        return f"{value / 3600:g} h"
    if value >= 120 and value % 60 == 0:
        return f"{value / 60:g} min"
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"
