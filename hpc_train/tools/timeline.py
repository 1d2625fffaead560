"""Where a run's hours went, on one time axis: ``python -m hpc_train.plot RUN --timeline``.

One row per Slurm allocation (a requeue is a new one). In each, the attempts the supervisor ran, split the way
the goodput ledger splits them (``core.goodput``): start-up (the job's start to its first step), productive
training (up to the step the run kept), redone work (steps after the last checkpoint, trained again by the next
attempt, and a failed attempt's teardown), and the restart gaps between attempts. Before each allocation, its
wait in the queue (from the submission, or from the end of the allocation before it). Marks: checkpoints, stop
signals and failures. Under an allocation's bar, a thin band for each straggler the run named
(``status/stragglers.json``): from the first of its slow windows to the last. The title gives the ETTR
(productive time / allocated time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_train.core.goodput import GoodputLedger, ledger
from hpc_train.core.records import AttemptRecord, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.train.plots import pyplot, save

__all__ = ["Bar", "Mark", "Timeline", "plot_timeline", "timeline"]

COLOURS = {
    "queue": "#d9d9d9",
    "startup": "#f4a261",
    "productive": "#2a9d8f",
    "redone": "#e76f51",
    "gap": "#8d99ae",
}
LABELS = {
    "queue": "waiting in the queue",
    "startup": "start-up",
    "productive": "productive training",
    "redone": "redone work / teardown",
    "gap": "restart gap",
}


@dataclass(frozen=True)
class Bar:
    row: int
    kind: str
    """One of COLOURS' keys."""
    start: float
    end: float
    text: str = ""


@dataclass(frozen=True)
class Mark:
    row: int
    kind: str
    """checkpoint, stop, failure or grow."""
    time: float
    text: str = ""


@dataclass
class Timeline:
    rows: list[str] = field(default_factory=list)
    """One label per allocation: its job id and requeue count."""
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    slow: list[Bar] = field(default_factory=list)
    """Stragglers (kind ``straggler``): a rank's run of slow windows, on the row of its allocation."""
    goodput: GoodputLedger | None = None
    """The run's goodput ledger (None for a run that never had a Slurm allocation)."""

    @property
    def origin(self) -> float:
        return min([b.start for b in self.bars] + [m.time for m in self.marks], default=0.0)

    def totals(self) -> dict[str, float]:
        """Seconds per kind of bar."""
        out = dict.fromkeys(COLOURS, 0.0)
        for bar in self.bars:
            out[bar.kind] += bar.end - bar.start
        return out


def timeline(rd: RunDir, goodput: GoodputLedger | None = None) -> Timeline:
    """The run's allocations, attempts and events (empty rows for a run that never had a Slurm allocation).
    ``goodput``: the run's ledger, when the caller has it already (``jobs status`` brings it up to now)."""
    allocations = rd.allocation_records()
    attempts = rd.attempt_records()
    if goodput is None and allocations:
        goodput = ledger(allocations, attempts, growths=rd.growth_records())
    out = Timeline(goodput=goodput)
    if not allocations:
        return out
    job = rd.job()
    submitted = job.submitted if job is not None else None
    row_of: dict[tuple[str, int], int] = {}
    before = submitted
    for row, allocation in enumerate(allocations):
        row_of[allocation.allocation] = row
        requeue = f" (requeue {allocation.requeue})" if allocation.requeue else ""
        got = ""
        if allocation.asked:  # a node range: the count it got, as the row's second line
            got = f"\n{len(allocation.nodes)} of {allocation.min_nodes}-{allocation.max_nodes} nodes"
        out.rows.append(f"job {allocation.job_id}{requeue}{got}")
        if before is not None and before < allocation.start:
            out.bars.append(Bar(row, "queue", before, allocation.start))
        before = allocation.end
    by_attempt = {r.attempt: r for r in (out.goodput.per_attempt if out.goodput is not None else ())}
    ranged = any(a.asked for a in allocations)  # the attempts' bars say on how many nodes each trained
    last_end: dict[int, float] = {}
    for attempt in attempts:
        found = row_of.get(attempt.allocation)
        figures = by_attempt.get(attempt.attempt)
        if found is None or figures is None or attempt.start is None:
            continue
        row = found
        if row in last_end and attempt.start > last_end[row]:
            out.bars.append(Bar(row, "gap", last_end[row], attempt.start))
        at = attempt.start
        spans = {"startup": figures.startup_s, "productive": figures.productive_s, "redone": figures.redone_s}
        for kind, seconds in spans.items():
            span = float(seconds)
            if span > 0:
                nodes = f", {len(attempt.nodes)} nodes" if ranged else ""
                text = f"attempt {attempt.attempt}{nodes}" if kind == "productive" else ""
                out.bars.append(Bar(row, kind, at, at + span, text))
            at += span
        last_end[row] = at
        if attempt.failure is not None:
            out.marks.append(Mark(row, "failure", at, attempt.failure.kind))
    by_number = {a.attempt: a for a in attempts}
    for entry in rd.requeue_records():
        stopped = by_number.get(entry.attempt)
        on_row = None if stopped is None else row_of.get(stopped.allocation)
        when = _signalled(entry, stopped)
        if on_row is not None and when is not None:
            out.marks.append(Mark(on_row, "stop", when, f"signal {entry.signal}"))
    for allocation in allocations:  # the supervisor's own start and end, outside every attempt
        row = row_of[allocation.allocation]
        inside = [b for b in out.bars if b.row == row and b.kind != "queue"]
        if not inside:
            continue
        first, last = min(b.start for b in inside), max(b.end for b in inside)
        if first > allocation.start:
            out.bars.append(Bar(row, "gap", allocation.start, first))
        if allocation.end is not None and allocation.end > last:
            out.bars.append(Bar(row, "gap", last, allocation.end))
    for growth in rd.growth_records():  # the supervisor's decision to come back on more nodes
        grew = by_number.get(growth.attempt) if growth.attempt is not None else None
        on_row = None if grew is None else row_of.get(grew.allocation)
        if on_row is not None:
            out.marks.append(Mark(on_row, "grow", growth.time, f"grow to {growth.nodes_expected}"))
    out.marks += _checkpoint_marks(rd, out, allocations_rows=row_of, attempts=attempts)
    out.slow = _straggler_spans(rd, allocations)
    return out


STRAGGLER_COLOUR = "#b5179e"


def _straggler_spans(rd: RunDir, allocations: list[Any]) -> list[Bar]:
    """Each straggler's run of slow windows (its first window's start to its last window's end), on the row of
    the allocation it began in."""
    ends: dict[tuple[int, float], tuple[float, str]] = {}
    for report in rd.straggler_reports():
        for slow in report.ranks:
            if slow.since_time is None:
                continue
            text = f"rank {slow.rank}{f' ({slow.host})' if slow.host else ''} {slow.slowdown:.1f}x"
            key = (slow.rank, slow.since_time)
            if key not in ends or report.time >= ends[key][0]:
                ends[key] = (report.time, text)
    spans = []
    for (_, since), (until, text) in sorted(ends.items(), key=lambda item: item[0][1]):
        rows = [r for r, a in enumerate(allocations) if a.start <= since and (a.end is None or since <= a.end)]
        if rows:
            spans.append(Bar(rows[-1], "straggler", since, until, text))
    return spans


def _signalled(entry: RequeueEntry, attempt: AttemptRecord | None) -> float | None:
    """When the stop signal came: its checkpoint was durable ``stop_saved_s`` later."""
    progress = attempt.progress if attempt is not None else None
    saved = entry.stop_saved_s or 0.0
    if progress is not None and progress.checkpoint_time and progress.checkpoint_step == entry.stopped_step:
        return progress.checkpoint_time - saved
    return None if entry.time is None else entry.time - saved


def _checkpoint_marks(
    rd: RunDir, out: Timeline, allocations_rows: dict[tuple[str, int], int], attempts: list[AttemptRecord]
) -> list[Mark]:
    """A mark at each checkpoint the ledger still holds, and at each attempt's latest one, on the row of the
    attempt that wrote it."""
    written = rd.checkpoint_ledger_record()
    found: dict[float, int | None] = {r.time: r.step for r in (written.checkpoints if written is not None else ())}
    for attempt in attempts:
        progress = attempt.progress
        if progress is not None and progress.checkpoint_time:
            found.setdefault(float(progress.checkpoint_time), progress.checkpoint_step)
    marks = []
    for when, step in sorted(found.items()):
        for attempt in attempts:
            end = attempt.end if attempt.end is not None else float("inf")
            row = allocations_rows.get(attempt.allocation)
            if row is not None and attempt.start is not None and attempt.start <= when <= end:
                marks.append(Mark(row, "checkpoint", when, f"step {step}"))
                break
    return marks


def plot_timeline(run_dir: str | Path, out: Path | None = None) -> Path:
    """Draw the run's timeline into ``out`` (default ``<run dir>/plots/timeline.png``); ValueError for a run
    with no Slurm allocation on record."""

    rd = RunDir(Path(run_dir))
    line = timeline(rd)
    gp = line.goodput
    if not line.rows or gp is None:  # (a run with an allocation has a ledger)
        raise ValueError(
            f"{rd.path} has no Slurm allocation on record (status/allocations.json): the timeline draws the "
            "allocations and attempts of a Slurm job"
        )
    plt = pyplot()
    origin = line.origin
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.7 * len(line.rows)))
    for bar in line.bars:
        left, width = (bar.start - origin) / 60, (bar.end - bar.start) / 60
        ax.barh(bar.row, width, left=left, height=0.5, color=COLOURS[bar.kind], edgecolor="white", linewidth=0.5)
        if bar.text:
            ax.text(left + width / 2, bar.row, bar.text, ha="center", va="center", fontsize=8, color="white")
    styles = {
        "checkpoint": ("|", "black", 12),
        "stop": ("v", "#6a4c93", 9),
        "failure": ("X", "#c1121f", 9),
        "grow": ("^", "#1d3557", 9),
    }
    for span in line.slow:
        left, width = (span.start - origin) / 60, max((span.end - span.start) / 60, 0.05)
        ax.barh(span.row + 0.34, width, left=left, height=0.1, color=STRAGGLER_COLOUR)
        ax.text(left, span.row + 0.42, span.text, ha="left", va="top", fontsize=7, color=STRAGGLER_COLOUR)
    for mark in line.marks:
        symbol, colour, size = styles[mark.kind]
        x = (mark.time - origin) / 60
        ax.plot(x, mark.row, symbol, color=colour, markersize=size)
        if mark.kind != "checkpoint":
            ax.text(x, mark.row - 0.33, mark.text, ha="center", va="bottom", fontsize=7, color=colour)
    ax.set_yticks(range(len(line.rows)), line.rows)
    ax.set_ylim(len(line.rows) - 0.4 + (0.15 if line.slow else 0.0), -0.8)
    ax.set_xlabel("minutes since the submission")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in COLOURS]
    handles += [plt.Line2D([], [], marker=s, color=c, linestyle="") for s, c, _ in styles.values()]
    names = [LABELS[k] for k in COLOURS] + ["checkpoint", "stop signal", "failure", "decision to grow"]
    if line.slow:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=STRAGGLER_COLOUR))
        names.append("straggler (its own time x the others' median)")
    ax.legend(
        handles,
        names,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 - 0.05 / len(line.rows)),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    ax.set_title(
        f"{rd.path.name}: ETTR {gp.ettr:.2f} ({gp.productive_s:.0f} s productive of {gp.wall_s:.0f} s allocated; "
        f"{gp.attempts} attempts, {gp.allocations} allocations)",
        fontsize=10,
    )
    path = out or rd.plots / "timeline.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, path)


def summary(rd: RunDir, goodput: GoodputLedger | None = None) -> str:
    """One line for ``jobs status``: where the time went, and how to draw it ('' for a run with no allocation)."""
    line = timeline(rd, goodput)
    gp = line.goodput
    if not line.rows or gp is None:  # (a run with an allocation has a ledger)
        return ""
    totals = line.totals()
    parts = ", ".join(f"{LABELS[k]} {totals[k]:.0f}s" for k in COLOURS if totals[k] >= 0.5)
    return (
        f"{rd.path}: {len(line.rows)} allocation(s), {gp.attempts} attempt(s): {parts}; "
        f"ETTR {gp.ettr:.2f} (draw it: python -m hpc_train.plot {rd.path} --timeline)"
    )
