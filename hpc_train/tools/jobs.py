"""``python -m hpc_train.jobs``: status, logs, cancel and collect for runs, sweeps and job ids.

    python -m hpc_train.jobs status  TARGET...          # state of each run (squeue + sacct + rank files)
    python -m hpc_train.jobs logs    TARGET [--rank N] [--slurm] [--follow]
    python -m hpc_train.jobs cancel  TARGET...
    python -m hpc_train.jobs collect SWEEP_DIR          # one row per sweep element: state and final metrics
    python -m hpc_train.jobs restore-config RUN_DIR     # a damaged or lost config.yaml, from the newest checkpoint

TARGET is a run dir, a sweep dir (``multirun/...``) or a Slurm job id (``123`` or ``123_4``); job ids are
looked up in the job.json files under ./outputs and ./multirun (or --search DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_train.core.errors import ConfigError, ExitCode
from hpc_train.core.files import atomic_write
from hpc_train.core.goodput import GoodputLedger, PackLedger, ledger, pack_ledger
from hpc_train.core.hostlist import compress_hostlist
from hpc_train.core.metrics import metric_keys
from hpc_train.core.nodes import NODE_EVERY_S
from hpc_train.core.records import (
    AttemptRecord,
    JobRecord,
    MirrorStatus,
    PackPlace,
    StartupProfile,
    StragglerReport,
)
from hpc_train.core.rundir import JOB_RECORD, RunDir, run_labels
from hpc_train.core.state import signal_live_ranks
from hpc_train.core.textutil import format_table, number_ranges, plural
from hpc_train.launch.state import JobState, job_state
from hpc_train.tools.pull import cmd_pull
from hpc_train.tools.timeline import summary

__all__ = ["main"]

JOB_ID = re.compile(r"\d+(_\d+)?")


class TargetError(ValueError):
    """A target that names no run."""


def _sweep_runs(path: Path) -> list[RunDir]:
    # Not hidden folders: Hydra's .hydra/ holds a config.yaml of its own, but is no run.
    subdirs = [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and RunDir.holds_run(p)]
    return [
        RunDir(p)
        for p in sorted(subdirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
    ]


def _job_records(roots: list[Path]) -> Iterator[tuple[Path, JobRecord]]:
    for root in roots:
        if root.is_dir():
            for path in root.rglob(JOB_RECORD):
                record = RunDir(path.parent).job()
                if record is not None:
                    yield path.parent, record


def resolve_target(target: str, roots: list[Path]) -> list[RunDir]:
    """The run dirs a target names."""
    path = Path(target)
    if path.is_dir():
        if RunDir.holds_run(path):
            return [RunDir(path)]
        runs = _sweep_runs(path)
        if runs:
            return runs
        rd = RunDir(path)
        if rd.checkpoint_files() or rd.status_dir.is_dir():
            raise TargetError(
                f"{target}: a run dir without its {rd.config.name} (it has {rd.checkpoints.name}/ or "
                f"{rd.status_dir.name}/). HINT: restore it from the newest checkpoint: "
                f"python -m hpc_train.jobs restore-config {target}"
            )
        raise TargetError(f"{target}: neither a run dir (no {rd.config.name}) nor a sweep dir (no run dirs inside)")
    if JOB_ID.fullmatch(target):
        found = [RunDir(run) for run, record in _job_records(roots) if target in (record.job_id, record.array_job_id)]
        if found:
            return sorted(found, key=lambda rd: str(rd.path))
        where = ", ".join(str(r) for r in roots)
        raise TargetError(
            f"job {target}: no run dir under {where} has that job id. HINT: pass the run dir, or --search DIR"
        )
    raise TargetError(f"{target}: no such directory, and not a Slurm job id")


def _world_size(run_dir: RunDir) -> int:
    # omegaconf only where a config is read: jobs status polls stay light
    from hpc_train.config import load_config

    try:
        return load_config(run_dir.config).cluster.world_size
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if str(run_dir.config) in message else f"{run_dir.config}: {message}") from None
    except Exception as exc:  # noqa: BLE001 - YAML that does not parse, bytes that are no UTF-8, an unreadable file
        raise ConfigError(
            f"{run_dir.config} cannot be read ({_error(exc)}). HINT: "
            f"restore it from the newest checkpoint: python -m hpc_train.jobs restore-config {run_dir.path}"
        ) from None


def _error(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("-" if value is None else str(value))


def _state(run_dir: RunDir) -> JobState:
    return job_state(run_dir, _world_size(run_dir))


def _goodput(run_dir: RunDir, attempts: list[AttemptRecord]) -> GoodputLedger | None:
    """The goodput ledger, brought up to now while the job runs (the supervisor writes it at each attempt's
    start and end; the running attempt's progress is on disk); None before the first attempt."""

    if not attempts:
        return None
    if attempts[-1].end is None:
        attempts = [*attempts[:-1], replace(attempts[-1], progress=run_dir.progress_record(0))]
    return ledger(run_dir.allocation_records(), attempts, growths=run_dir.growth_records())


def _failure_tail(run_dir: RunDir, attempts: list[AttemptRecord], lines: int = 8) -> str:
    """The last failure's class, rank, host and traceback tail, for a job whose supervisor recorded one."""
    failure = attempts[-1].failure if attempts else None
    if failure is None:
        return ""
    tail = "\n".join("    " + line for line in failure.traceback.strip().splitlines()[-lines:])
    head = f"  {run_dir.path}: attempt {attempts[-1].attempt}: {failure.describe()}"
    return head + ("\n" + tail if tail else "")


SILENT_AFTER_S = 3 * NODE_EVERY_S
"""A node with live ranks whose summary is older than this has stopped being heard."""


def nodes_heard(run_dir: RunDir, now: float, shown: int = 5) -> list[str]:
    """When the nodes whose ranks have not ended were last heard: one line for all of them, then the first few
    that have been silent for SILENT_AFTER_S (a node that died: its summary says when it was last heard) and a
    count of the rest."""
    newest = run_dir.rank_statuses()  # a node of an earlier attempt whose ranks since reported elsewhere: not live
    live = [s for s in run_dir.node_summaries() if any(r.state.live and newest.get(r.rank) == r for r in s.ranks)]
    if not live:
        return []
    ages = [now - s.time for s in live]
    lines = [f"{run_dir.path}: {plural(len(live), 'node')}, last heard {min(ages):.0f}-{max(ages):.0f} s ago"]
    silent = sorted((s for s in live if now - s.time > SILENT_AFTER_S), key=lambda s: s.time)
    for node in silent[:shown]:
        ranks = [r for r in node.ranks if r.state.live and newest.get(r.rank) == r]
        steps = [r.step for r in ranks if r.step is not None]
        at = f" at step {max(steps)}" if steps else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(node.time))
        lines.append(
            f"{node.host}: silent, last heard {now - node.time:.0f} s ago ({when}); ranks "
            f"{number_ranges(r.rank for r in ranks)} were {'/'.join(sorted({r.state.value for r in ranks}))}{at}"
        )
    if len(silent) > shown:
        lines.append(
            f"and {len(silent) - shown} more silent nodes: {compress_hostlist([s.host for s in silent[shown:]])}"
        )
    return lines


def straggler_lines(run_dir: RunDir, now: float) -> list[str]:
    """The run's stragglers (``status/stragglers.json``): the ranks named in the latest window, or when the last
    ones were and that they recovered; nothing for a run that never had one."""
    return _straggler_lines(run_dir.path, run_dir.straggler_reports(), now)


def _straggler_lines(path: Path, reports: list[StragglerReport], now: float) -> list[str]:
    named = [r for r in reports if r.ranks]
    if not named:
        return []
    latest = reports[-1]
    when = f"step {latest.step}, {now - latest.time:.0f} s ago"
    if latest.ranks:
        return [f"{path}: {latest.describe()} ({when})"]
    last = named[-1]
    who = "; ".join(r.describe() for r in last.ranks)
    return [f"{path}: none now ({when}); the last: {who}, until step {last.step}"]


def mirror_line(run_dir: RunDir, now: float) -> str:
    """What the run's mirror holds, as rank 0 last said (``status/mirror.json``); '' for a run without one."""
    return _mirror_line(run_dir.path, run_dir.mirror_state(), now)


def _mirror_line(path: Path, state: MirrorStatus | None, now: float) -> str:
    if state is None:
        return ""
    holds = f"holds step {state.landed_step} verified" if state.landed else "holds no checkpoint yet"
    took = f"; the copy took {state.seconds:.1f} s" if state.seconds is not None and not state.error else ""
    failed = f"; the latest copy failed: {state.error}" if state.error else took
    return f"{path}: {state.store} {holds} ({now - state.time:.0f} s ago){failed}"


def startup_maxima(run_dir: RunDir) -> dict[str, tuple[float, StartupProfile]]:
    """For each start-up phase (and hpc_train's own part, ``own``), its longest time and the rank it was on."""
    return _startup_maxima(list(run_dir.startup_profiles().values()))


def _startup_maxima(profiles: list[StartupProfile]) -> dict[str, tuple[float, StartupProfile]]:
    maxima: dict[str, tuple[float, StartupProfile]] = {}
    for phase in [*StartupProfile.PHASES, "own"]:
        timed = [(p.own_s if phase == "own" else p.seconds(phase), p) for p in profiles]
        found = [(s, p) for s, p in timed if s is not None]
        if found:
            maxima[phase] = max(found, key=lambda item: item[0])
    return maxima


def slowest_startup(run_dir: RunDir) -> str:
    """``interpreter 0.42 (rank 3, node2), ...`` over every rank that reported its start-up ('' before any)."""
    profiles = list(run_dir.startup_profiles().values())
    return _slowest_startup(_startup_maxima(profiles), len(profiles))


def _slowest_startup(maxima: dict[str, tuple[float, StartupProfile]], count: int) -> str:
    if not maxima:
        return ""
    phases = ", ".join(
        f"{'hpc_train own' if phase == 'own' else phase.replace('_', ' ')} {s:.2f} (rank {p.rank}, {p.host})"
        for phase, (s, p) in maxima.items()
    )
    return f"{plural(count, 'rank')}: {phases}"


def _step(state: JobState) -> int:
    """The furthest step a rank reported (0 before any; a status without a step number counts for none)."""
    steps = [s.step for s in state.ranks.values() if s.step is not None]
    return max(steps, default=0)


DAMAGED_HINT = (
    "HINT: the run writes these files itself, each at once (never half of one): a damaged one was truncated "
    "(a full disk?) or written by something else. A rank's status is rewritten at its next report; move a file "
    "that stays damaged away (it is left out of the state above)."
)


@dataclass(frozen=True)
class RunView:
    """What ``jobs status`` says about one run, read once from its run dir: the JSON record and the text
    sections are both rendered from it (``status_json``, ``status_text``)."""

    run_dir: Path
    state: JobState
    step: int
    """The furthest step a rank reported."""
    last: AttemptRecord | None
    """The supervisor's latest attempt (None before the first, or for a run without a supervisor)."""
    goodput: GoodputLedger | None
    job: JobRecord | None
    failure_tail: str
    """The last failure's class, rank, host and traceback tail ('' for a run in good state)."""
    timeline: str
    heard: tuple[str, ...]
    stragglers: tuple[str, ...]
    straggler_report: StragglerReport | None
    mirror: MirrorStatus | None
    mirror_line: str
    startup: dict[str, tuple[float, StartupProfile]]
    slowest_startup: str
    node_summary: str
    """Where a node's summary is, relative to the run dir (the text names it)."""

    @classmethod
    def of(cls, rd: RunDir, now: float) -> RunView:
        """The view of ``rd`` at ``now``; ConfigError for a run dir whose config.yaml no longer loads."""
        state = _state(rd)
        attempts = state.attempts
        goodput = _goodput(rd, attempts)
        job = rd.job()
        # Each record read once: the text and the JSON are made from the same reading.
        reports, mirror = rd.straggler_reports(), rd.mirror_state()
        profiles = list(rd.startup_profiles().values())
        startup = _startup_maxima(profiles)
        return cls(
            run_dir=rd.path,
            state=state,
            step=_step(state),
            last=attempts[-1] if attempts else None,
            goodput=goodput,
            job=job,
            failure_tail="" if state.ok else _failure_tail(rd, attempts),
            timeline=summary(rd, goodput),  # the ledger computed once
            heard=tuple(nodes_heard(rd, now)),
            stragglers=tuple(_straggler_lines(rd.path, reports, now)),
            straggler_report=reports[-1] if reports else None,
            mirror=mirror,
            mirror_line=_mirror_line(rd.path, mirror, now),
            startup=startup,
            slowest_startup=_slowest_startup(startup, len(profiles)),
            node_summary=str(rd.node_summary("<host>").relative_to(rd.path)),
        )

    @property
    def attempt(self) -> int | None:
        return self.last.attempt if self.last is not None else None

    @property
    def pack(self) -> PackPlace | None:
        """The run's place in a pack (``cluster.pack``), or None."""
        return self.job.pack if self.job is not None else None

    @property
    def key(self) -> str:
        """The run dir, resolved: how a pack's ledger finds its members' own."""
        return str(self.run_dir.resolve())

    def row(self) -> list[Any]:
        """The table's row."""
        g, state = self.goodput, self.state
        detail = state.detail or "-"
        if self.pack is not None:  # cluster.pack: the job it ran in ran its neighbours too
            detail = f"pack member {self.pack.index} of {len(self.pack.members)} in job {state.job_id}; {detail}"
        ettr, lost = (f"{g.ettr:.2f}", f"{g.lost_s:.0f}s") if g is not None else ("-", "-")
        return [self.run_dir, state.job_id or "-", state.state, _fmt(self.attempt), self.step, ettr, lost, detail]

    def record(self, pack_goodput: PackLedger | None) -> dict[str, Any]:
        """The JSON record."""
        state, last = self.state, self.last
        return {
            "run_dir": str(self.run_dir),
            "job_id": state.job_id,
            "pack": self.pack.to_json() if self.pack is not None else None,
            "pack_goodput": pack_goodput.to_json() if pack_goodput is not None else None,
            "state": state.state,
            "done": state.done,
            "ok": state.ok,
            "step": self.step,
            "attempt": self.attempt,
            "failure": last.failure.to_json() if last is not None and last.failure is not None else None,
            "goodput": self.goodput.to_json() if self.goodput is not None else {},
            "detail": state.detail,
            "squeue": state.squeue,
            "sacct": state.sacct,
            "damaged": state.damaged,
            "startup": {p: {"s": s, "rank": r.rank, "host": r.host} for p, (s, r) in self.startup.items()},
            "stragglers": self.straggler_report.to_json() if self.straggler_report is not None else None,
            "mirror": self.mirror.to_json() if self.mirror is not None else None,
        }


def status_views(runs: list[RunDir], now: float) -> tuple[list[RunView], list[str]]:
    """Each run's view, and a line for each run dir whose config no longer loads (the others are still shown)."""
    views: list[RunView] = []
    unreadable: list[str] = []
    with ExitStack() as held:
        for rd in runs:
            held.enter_context(rd.summaries_held())  # read once here, not once per view of the run
            try:
                views.append(RunView.of(rd, now))
            except ConfigError as exc:
                unreadable.append(f"hpc_train.jobs: {exc}")
    return views, unreadable


def pack_ledgers(views: list[RunView]) -> dict[tuple[str, ...], PackLedger]:
    """The ledger of each pack the views' runs are in; a member's own ledger is reused where it is shown."""
    packed: dict[tuple[str, ...], str] = {}  # each pack's members (resolved run dirs) -> its job id
    for view in views:
        if view.job is not None and view.job.pack is not None:
            packed.setdefault(view.job.pack.members, view.job.job_id)
    return _pack_ledgers(packed, {view.key: view.goodput for view in views})


def status_json(views: list[RunView], packs: dict[tuple[str, ...], PackLedger]) -> str:
    records = [view.record(packs.get(view.pack.members) if view.pack else None) for view in views]
    return json.dumps(records, indent=1)


def status_text(views: list[RunView], packs: dict[tuple[str, ...], PackLedger]) -> str:
    """The table, then a section for each thing some run has to say ('' when there are no runs)."""
    out = []
    if views:
        out.append(
            format_table(
                ["run dir", "job", "state", "attempt", "step", "ETTR", "lost", "detail"], [v.row() for v in views]
            )
        )
    node_summary = views[0].node_summary if views else ""
    sections = [
        ("failures (class, rank, host, traceback tail):", [v.failure_tail for v in views if v.failure_tail], ""),
        (
            f"nodes whose ranks have not said they ended (each node's summary, {node_summary}):",
            [line for v in views for line in v.heard],
            "  ",
        ),
        (
            "stragglers (own compute time per step against the other ranks' median, status/stragglers.json):",
            [line for v in views for line in v.stragglers],
            "  ",
        ),
        ("mirror (trainer.mirror, status/mirror.json):", [v.mirror_line for v in views if v.mirror_line], "  "),
        (
            "start-up, the slowest rank of each phase (seconds):",
            [f"{v.run_dir}: {v.slowest_startup}" for v in views if v.slowest_startup],
            "  ",
        ),
        ("where the time went:", [v.timeline for v in views if v.timeline] + _pack_lines(packs), "  "),
    ]
    for title, lines, indent in sections:
        if lines:
            out += [f"\n{title}", "\n".join(indent + line for line in lines)]
    damaged = [line for v in views for line in v.state.damaged]
    if damaged:
        out += ["\ndamaged records (left out of the state above):", "\n".join(f"  {line}" for line in damaged)]
        out.append(DAMAGED_HINT)
    return "\n".join(out)


def cmd_status(runs: list[RunDir], as_json: bool) -> int:
    views, unreadable = status_views(runs, time.time())
    packs = pack_ledgers(views)
    shown = status_json(views, packs) if as_json else status_text(views, packs)
    if shown or as_json:
        print(shown)
    for line in unreadable:
        print(line, file=sys.stderr)
    return 2 if unreadable else 0


def _pack_ledgers(
    packed: dict[tuple[str, ...], str], goodputs: dict[str, GoodputLedger | None]
) -> dict[tuple[str, ...], PackLedger]:
    """The ledger of each pack (``cluster.pack``), by its members' run dirs; ``packed``: each pack's job id, as
    the members' job records say; ``goodputs``: the members' own ledgers already computed, by resolved run dir."""

    packs: dict[tuple[str, ...], PackLedger] = {}
    for members, job_id in packed.items():
        if not members:
            continue
        dirs = [RunDir(Path(m)) for m in members]
        ledgers = [goodputs.get(m) or _goodput(d, d.attempt_records()) for m, d in zip(members, dirs, strict=True)]
        packs[members] = pack_ledger([d.allocation_records() for d in dirs], ledgers, job_id=job_id)
    return packs


def _pack_lines(pack_ledgers: dict[tuple[str, ...], PackLedger]) -> list[str]:
    """A line per pack: the time its jobs were held for all its members, and how much of it trained."""
    lines = []
    for members, g in pack_ledgers.items():
        if not g.allocations:
            continue
        lines.append(
            f"pack in job {g.job_id} ({g.members} members, {g.allocations} allocation(s)): held "
            f"{g.wall_s:.0f}s for each member, {g.productive_s:.0f}s productive in all; ETTR {g.ettr:.2f} "
            f"(members: {', '.join(members)})"
        )
    return lines


def cmd_collect(runs: list[RunDir]) -> int:
    finals = [rd.last_metrics() for rd in runs]
    keys = metric_keys(finals)  # the losses, the validation metric and any other number the rows hold
    rows = []
    # Each element's overrides less those all share: what they share is noise in every row.
    for index, (rd, label, final) in enumerate(zip(runs, run_labels(runs), finals, strict=True)):
        state = _state(rd)
        rows.append(
            [index, label or "-", state.job_id or "-", state.state, final.get("step"), *(final.get(k) for k in keys)]
        )
    header = ["#", "overrides", "job", "state", "step", *keys]
    print(format_table(header, [[_fmt(c) for c in row] for row in rows]))
    return 0


def cmd_logs(run_dir: RunDir, rank: int, slurm: bool, follow: bool, timeout_s: float) -> int:
    job = run_dir.job()
    if slurm:
        output = job.slurm_output if job is not None else ""
        if not output:
            print(f"{run_dir.path}: no Slurm output recorded (not a Slurm run?)", file=sys.stderr)
            return ExitCode.USAGE
        print(Path(output).read_text(errors="replace") if Path(output).exists() else f"({output} does not exist yet)")
        return 0
    if follow:
        # omegaconf only for --follow
        from hpc_train.launch.slurm import follow_slurm

        return follow_slurm(run_dir, _world_size(run_dir), limit_s=timeout_s, rank=rank)
    path = run_dir.rank_log(rank)
    if not path.exists():
        print(f"{path} does not exist yet (rank {rank} has not started)", file=sys.stderr)
        return ExitCode.FAILED
    sys.stdout.write(path.read_text(errors="replace"))
    return 0


def cmd_cancel(runs: list[RunDir]) -> int:
    ids: list[str] = []
    code = 0
    named = {str(rd.path.resolve()) for rd in runs}
    for rd in runs:
        job = rd.job()
        others = [m for m in (job.pack.members if job is not None and job.pack else ()) if m not in named]
        if job is not None and others:  # scancel would end its neighbours too: its own supervisor ends it
            rd.request_cancel()
            print(
                f"cancel requested for {rd.path}, a member of the pack in Slurm job {job.job_id}: its "
                "supervisor stops its training step (the ranks checkpoint) within seconds, and starts no other. "
                f"The pack's other members go on: {', '.join(others)}"
            )
            continue
        if job is not None and job.job_id:
            which = job.array_job_id if len(runs) > 1 and job.array_job_id else job.job_id
            if which not in ids:
                ids.append(which)
        elif not _cancel_local(rd):
            code = ExitCode.FAILED
    if ids:
        proc = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            print(f"scancel failed: {proc.stderr.strip()}", file=sys.stderr)
            return ExitCode.FAILED
        print(f"cancelled Slurm job(s) {' '.join(ids)}")
    return code


def _cancel_local(run_dir: RunDir) -> bool:
    """SIGTERM to the ranks of a local run that still run here; False when a rank marked live could not be
    verified to be the process its status names (that process is left alone, and why is printed)."""
    statuses = run_dir.rank_statuses()
    refused: list[str] = []

    def refuse(rank: int, why: str) -> None:
        pid = statuses[rank].pid
        refused.append(
            f"hpc_train.jobs: rank {rank} of {run_dir.path} (pid {pid}) was not signalled: {why}. HINT: its status "
            f"({run_dir.status_path(rank)}) may be stale; if the rank does still run, find it with "
            f"`ps -ef | grep hpc_train` and end it yourself."
        )

    sent = signal_live_ranks(statuses, refused=refuse)
    for rank, pid in sent:
        print(f"sent SIGTERM to rank {rank} (pid {pid})")
    for line in refused:
        print(line, file=sys.stderr)
    if not sent and not refused:
        print(f"{run_dir.path}: no rank of this local run is still running here; nothing to cancel")
    return not refused


def cmd_restore_config(target: str) -> int:
    """Write a damaged or missing config.yaml again from the config the newest loadable checkpoint holds; the
    file it replaces is kept as config.yaml.damaged."""
    # omegaconf and torch only for restore-config
    from omegaconf import OmegaConf

    # omegaconf only where a config is read: jobs status polls stay light
    from hpc_train.config import load_config
    from hpc_train.train.checkpoint import find_resumable

    rd = RunDir(Path(target))
    if not rd.path.is_dir():
        print(f"hpc_train.jobs: {target}: no such directory. HINT: pass a run dir", file=sys.stderr)
        return ExitCode.USAGE
    if rd.config.is_file() and not rd.config.is_symlink():
        try:
            load_config(rd.config)
        except Exception as exc:  # noqa: BLE001 - whatever keeps it from loading is damage to repair
            problem = _error(exc)
        else:
            print(
                f"hpc_train.jobs: {rd.config} loads and validates; nothing to restore. HINT: to go back to the "
                f"config of the newest checkpoint anyway, move it away first (mv {rd.config} {rd.config}.mine)",
                file=sys.stderr,
            )
            return ExitCode.FAILED
    else:
        problem = "missing" if not os.path.lexists(rd.config) else "not a regular file"
    found = find_resumable(rd.checkpoint_files())
    if found is None:
        print(
            f"hpc_train.jobs: {rd.config} ({problem}) cannot be restored: {rd.checkpoints} holds no loadable "
            "checkpoint. HINT: write it again with the overrides that made the run: `python -m hpc_train "
            f"hydra.run.dir={rd.path} <overrides> --cfg job` prints the config (overrides.json lists them)",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    checkpoint, state = found
    config = state.get("config")
    if not isinstance(config, dict):
        print(
            f"hpc_train.jobs: {rd.config} ({problem}) cannot be restored: {checkpoint} holds no config (key "
            f"'config' is {type(config).__name__}; a checkpoint older than the config it saves?). HINT: write it "
            "again with the overrides that made the run (overrides.json lists them)",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    text = OmegaConf.to_yaml(OmegaConf.create(config))
    staged = rd.path / f".{rd.config.name}.restored"
    atomic_write(staged, lambda f: f.write(text.encode()))
    try:
        load_config(staged)
    except Exception as exc:  # noqa: BLE001 - a config this version cannot load is no restoration
        staged.unlink(missing_ok=True)
        print(
            f"hpc_train.jobs: the config in {checkpoint} does not validate ({_error(exc)}); {rd.config} was left "
            "as it is. HINT: a "
            "checkpoint of another hpc_train version? Restore with that version, or write the config again",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    kept = ""
    if os.path.lexists(rd.config):
        damaged = _free_name(rd.path / f"{rd.config.name}.damaged")
        os.rename(rd.config, damaged)
        kept = f"; the file it replaced is kept as {damaged}"
    os.replace(staged, rd.config)
    print(f"restored {rd.config} ({problem}) from the config in {checkpoint} (step {state.get('step')}){kept}")
    return 0


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first that does not exist (nothing kept is overwritten)."""
    candidate, n = path, 0
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.jobs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--search", action="append", type=Path, help="where to look up job ids (default: ./outputs, ./multirun)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="state of runs, sweeps or jobs")
    status.add_argument("targets", nargs="+")
    status.add_argument("--json", action="store_true", help="one JSON object per run")
    logs = sub.add_parser("logs", help="a rank's log (rank 0 by default)")
    logs.add_argument("target")
    logs.add_argument("--rank", type=int, default=0)
    logs.add_argument("--slurm", action="store_true", help="Slurm's own output file of the job instead")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--timeout", type=float, default=24 * 3600, help="stop following after this many seconds")
    cancel = sub.add_parser("cancel", help="scancel the job(s); a sweep dir cancels its whole array")
    cancel.add_argument("targets", nargs="+")
    collect = sub.add_parser("collect", help="one row per sweep element: state and final metrics")
    collect.add_argument("sweep_dir")
    restore = sub.add_parser(
        "restore-config",
        help="write a damaged or missing config.yaml again from the newest checkpoint (the old one is kept as "
        "config.yaml.damaged)",
    )
    restore.add_argument("run_dir")
    pull = sub.add_parser(
        "pull",
        help="bring a mirrored run (trainer.mirror) back to a file system: every file its ledger names, each "
        "checked against it; a different file already there is kept as <name>.before-pull",
    )
    pull.add_argument("mirror", help="the mirror's path or URL, as trainer.mirror named it")
    pull.add_argument("run_dir")
    args = parser.parse_args(argv)
    roots = args.search or [Path("outputs"), Path("multirun")]
    try:
        if args.command == "status":
            return cmd_status([rd for t in args.targets for rd in resolve_target(t, roots)], args.json)
        if args.command == "collect":
            return cmd_collect(resolve_target(args.sweep_dir, roots))
        if args.command == "cancel":
            return cmd_cancel([rd for t in args.targets for rd in resolve_target(t, roots)])
        if args.command == "restore-config":
            return cmd_restore_config(args.run_dir)
        if args.command == "pull":
            return cmd_pull(args.mirror, Path(args.run_dir))
        runs = resolve_target(args.target, roots)
        if len(runs) != 1:
            raise TargetError(f"{args.target} names {len(runs)} runs; logs shows one: pass one run dir or element id")
        return cmd_logs(runs[0], args.rank, args.slurm, args.follow, args.timeout)
    except (TargetError, ConfigError) as exc:  # a run dir whose config.yaml no longer validates
        print(f"hpc_train.jobs: {exc}", file=sys.stderr)
        return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
