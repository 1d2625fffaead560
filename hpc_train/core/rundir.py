"""A run directory: every file name and format in it, in one place.

The names are a public contract (``config.yaml``, ``metrics.jsonl``, ``model_final.pt``, ``logs/``, ...):
scripts and later tools find a run's outputs by them, and every module here reaches them through ``RunDir``.

    config.yaml                the resolved, validated config every rank reads
    overrides.json             the command-line overrides that made the run (every launcher): its label
    metrics.jsonl              one JSON row per log/validation step (rank 0)
    model_final.pt             the trained weights; model_best.pt with early stopping
    rank_table.json            every rank's host, device and rendezvous address
    job.json, job.sbatch       what was submitted to Slurm (Slurm runs only)
    launcher.log               the launcher's own output (runs started from hpc_train.api)
    owner.json                 the lease of the launch or Slurm job that owns the run dir (hpc_train.core.owner)
    checkpoints/step_<9 digits>.pt   (a damaged one is renamed step_<9 digits>.pt.damaged)
    logs/rank_<r>.log          each rank's log; rank_<r>.restart<k>.log after the k-th restart
    status/node_<host>.json    each node's ranks: their states and steps, and when the node was last heard
                               (rewritten every 10 s while it trains: hpc_train.core.nodes)
    status/rank_<r>.json       the last word of rank 0 and of each rank that failed (the others' are in their
                               node's summary); a rank run without a node channel writes its state here
    status/checkpoints.json    the checkpoints this run wrote, with their SHA-256: verified on load, the only ones pruned;
                               and a copy of trackers.json, made at each checkpoint
    status/restarts.json       one entry per attempt that stopped on a signal
    status/reshapes.json       one entry per change of shape (nodes x tasks): a resubmission, a node lost, a range job
                               given another count
    status/growths.json        one entry per stop to come back on more nodes (cluster.slurm.grow_every_min)
    status/attempts.json       one entry per training step the supervisor ran: nodes, times, outcome, failure class
                               (each record's keys and types: hpc_train.core.records)
    status/allocations.json    each Slurm allocation the run held (job id, start, end): the goodput ledger's wall
    status/goodput.json        the goodput ledger: allocated time, productive time, time lost, ettr
    status/bad_nodes.json      the nodes blamed for a failure, left out of later attempts when spares allow
    status/stragglers.json     rank 0's straggler verdicts (hpc_train.distributed.stragglers): one entry per change
                               of the ranks named, the last one rewritten at every window while nothing changes
    status/trackers.json       the MLflow / W&B run that holds this run dir, and the latest step logged to it
    status/batch_exit.json     srun's exit status, written by the sbatch script's teardown
    status/cancel.json         `jobs cancel` of one member of a pack (cluster.pack): its supervisor ends it alone
    status/interrupted.json    a local launcher ended its job on Ctrl-C (jobs status: STOPPED during start-up)
    status/mirror.json         rank 0's latest word on the mirror (trainer.mirror): what it holds, the last error
    status/pulled.json         where `jobs pull` brought the run dir from
    status/progress_<r>.json   the steps this attempt made, with times (the trainer's rank 0, or a user's script
                               through hpc_train.preemption), at the rank's end; while it runs, in the node's summary
    submitit/                  submitit's pickles, the raw stdout/stderr of each task, controller.log (the local
                               controller's stderr, and what the launcher's watcher did)
    profile/, tensorboard/, plots/
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

from hpc_train.core.errors import failed_step
from hpc_train.core.files import Tail, atomic_write, read_json, write_json_atomic
from hpc_train.core.identity import ATTEMPT_VARIABLE, JobIdentity
from hpc_train.core.metrics import MetricsWriter, drop_rows_after, last_metrics, read_metrics
from hpc_train.core.nodes import NodeChannel
from hpc_train.core.records import (
    Allocation,
    AttemptRecord,
    BadNode,
    BatchExit,
    CheckpointLedger,
    Growth,
    Interrupted,
    JobRecord,
    MirrorOrigin,
    MirrorStatus,
    NodeSummary,
    Progress,
    RankState,
    RankStatus,
    RankTableEntry,
    RequeueEntry,
    Reshape,
    StartupProfile,
    StragglerReport,
    TrackerRun,
)
from hpc_train.core.state import process_start

__all__ = [
    "ATTEMPT_VARIABLE",
    "BATCH_EXIT",
    "HYDRA_OVERRIDES",
    "JOB_RECORD",
    "RunDir",
    "atomic_write",
    "read_json",
    "run_labels",
    "write_json_atomic",
]

JOB_RECORD = "job.json"
HYDRA_OVERRIDES = ".hydra/overrides.yaml"
"""Hydra's own record of a run's overrides (when hydra.output_subdir is left at .hydra): read for run dirs made
before ``overrides.json`` existed."""
BATCH_EXIT = "status/batch_exit.json"
"""Relative to the run dir: the sbatch script writes it from the shell."""
STRAGGLER_ENTRIES = 500
"""The most entries ``status/stragglers.json`` keeps (a rank that flaps in and out of slow adds one per change)."""
NODE_SUMMARY = "node_{host}.json"
"""A node's summary in status/ (``hpc_train.core.nodes``); ``RunDir.node_summary`` and ``node_summary_paths``
are the only users."""
_CHECKPOINT_GLOB = "step_*.pt"
log = logging.getLogger(__name__)


_Record = TypeVar(
    "_Record",
    AttemptRecord,
    Allocation,
    RequeueEntry,
    BadNode,
    Reshape,
    TrackerRun,
    Growth,
    StragglerReport,
    RankTableEntry,
)


def _read_dict(path: Path) -> dict[str, Any]:
    record = read_json(path)
    return record if isinstance(record, dict) else {}


def _load(path: Path) -> tuple[Any, str | None]:
    """The JSON value in ``path`` (None when the file does not exist), or why it cannot be read."""
    try:
        return json.loads(path.read_bytes()), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # a JSON error, or bytes that are no UTF-8
        return None, f"{path}: not valid JSON, truncated or overwritten? ({str(exc)[:120]}): ignored"


def _checked_list(path: Path, kind: type[_Record], what: str) -> tuple[list[_Record], list[str]]:
    """The records of a JSON list file, less what is damaged, with a line for each damaged record: an entry
    that is no JSON object, or lacks a key it needs, is left out; a key of the wrong type is dropped."""
    entries, unreadable = _load(path)
    if unreadable:
        return [], [unreadable]
    return _checked_entries(entries, path, kind, what)


def _checked_entries(entries: Any, path: Path, kind: type[_Record], what: str) -> tuple[list[_Record], list[str]]:
    """``_checked_list`` for a list already read (``path`` names where it came from)."""
    if entries is None:
        return [], []
    if not isinstance(entries, list):
        return [], [f"{path}: holds a JSON {type(entries).__name__}, not a list of {what}: ignored"]
    records: list[_Record] = []
    damaged: list[str] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            damaged.append(f"{path}: entry {index} is {entry!r:.80}, not a JSON object: ignored")
            continue
        record, problems = kind.salvage(entry)
        if record is None:
            damaged.append(f"{path}: entry {index}: {'; '.join(problems)}: ignored")
            continue
        damaged += [f"{path}: entry {index}: {problem}" for problem in problems]
        records.append(record)
    return records, damaged


def _newer_in_summaries(own: Mapping[int, Any], summarised: Iterable[RankStatus]) -> Iterator[RankStatus]:
    """The statuses in the nodes' summaries that win over the ranks' own files: ``own`` holds each rank's time
    there (a rank with none, or a time that is not a number, loses to its summary)."""
    for status in summarised:
        mine = own.get(status.rank)
        if not isinstance(mine, int | float) or (status.time or 0.0) > mine:
            yield status


def _with_newer(statuses: dict[int, RankStatus], summarised: Iterable[RankStatus]) -> dict[int, RankStatus]:
    """``statuses`` (read from the ranks' own files), each replaced by its rank's status in a node's summary
    where that is newer."""
    times = {rank: status.time for rank, status in statuses.items()}
    statuses.update((status.rank, status) for status in _newer_in_summaries(times, summarised))
    return statuses


def run_labels(runs: Sequence[RunDir]) -> list[str]:
    """Each run's overrides less those all the runs share (what sets an element of a sweep apart), space
    separated: the names ``jobs collect`` and ``plot --compare`` give the runs ("" for a run with none)."""
    overrides = [rd.label_overrides() for rd in runs]
    shared = set.intersection(*(set(o) for o in overrides)) if len(overrides) > 1 else set()
    return [" ".join(o for o in own if o not in shared) for own in overrides]


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory, and the readers and writers of its files."""

    path: Path
    node: NodeChannel | None = field(default=None, compare=False, repr=False)
    """This rank's node channel (``with_node``): its statuses and progress go through its node, to
    ``status/node_<host>.json``, instead of to a file of its own."""
    _held: tuple[NodeSummary, ...] | None = field(default=None, init=False, compare=False, repr=False)
    """The nodes' summaries as read once for ``summaries_held``."""

    @staticmethod
    def holds_run(path: Path) -> bool:
        """True when ``path`` is a run directory (it has a config.yaml)."""
        return RunDir(path).config.is_file()

    # ---- what the launcher writes -----------------------------------------------------------------------

    @property
    def config(self) -> Path:
        """The resolved, validated config every rank reads."""
        return self.path / "config.yaml"

    @property
    def overrides(self) -> Path:
        """The command-line overrides that made this run (a JSON list of strings), written at launch by every
        launcher: what ``jobs collect``, ``plot --compare`` and TensorBoard label the run with."""
        return self.path / "overrides.json"

    def write_overrides(self, overrides: Sequence[str]) -> None:
        write_json_atomic(self.overrides, [str(o) for o in overrides])

    def read_overrides(self) -> list[str]:
        """The run's overrides; for a run dir older than ``overrides.json``, those in job.json (Slurm runs) or in
        Hydra's .hydra/overrides.yaml. Empty when none is recorded."""
        recorded = read_json(self.overrides)
        job = self.job()
        if recorded is None and job is not None and job.overrides:
            recorded = list(job.overrides)
        if recorded is None and (self.path / HYDRA_OVERRIDES).is_file():
            from omegaconf import OmegaConf  # only for run dirs older than overrides.json

            recorded = OmegaConf.to_container(OmegaConf.load(self.path / HYDRA_OVERRIDES))
        return [str(o) for o in recorded] if isinstance(recorded, list) else []

    def label_overrides(self) -> list[str]:
        """The overrides that say what the run changed: without Hydra's flags (``--config-dir=...``), which are
        recorded for the resume command only."""
        return [o for o in self.read_overrides() if not o.startswith("-")]

    @property
    def job_record(self) -> Path:
        """What the scheduler was asked for: job id, array index, script, Slurm output file (Slurm runs only)."""
        return self.path / JOB_RECORD

    def job(self) -> JobRecord | None:
        """The job record (``JobRecord``); None when there is none (a local run) or it is damaged beyond its
        job id."""
        return JobRecord.salvage(read_json(self.job_record))[0]

    def write_job_record(self, record: JobRecord) -> None:
        write_json_atomic(self.job_record, record.to_json())

    @property
    def sbatch_script(self) -> Path:
        """The generated script of a single job (an array's script is in the sweep's log folder)."""
        return self.path / "job.sbatch"

    @property
    def launcher_log(self) -> Path:
        """The launcher's stdout and stderr, for runs started in the background (``hpc_train.api.submit``)."""
        return self.path / "launcher.log"

    @property
    def submitit(self) -> Path:
        """submitit's own folder: pickles and the raw stdout/stderr of each task."""
        return self.path / "submitit"

    @property
    def controller_log(self) -> Path:
        """The stderr of submitit's local controller (cluster=local)."""
        return self.submitit / "controller.log"

    # ---- what the ranks write -----------------------------------------------------------------------------

    @property
    def metrics(self) -> Path:
        """One JSON object per log/validation step, written by rank 0."""
        return self.path / "metrics.jsonl"

    def metrics_writer(self, enabled: bool) -> MetricsWriter:
        return MetricsWriter(self.metrics, enabled)

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every complete row so far (a row still being written is skipped)."""
        return read_metrics(self.metrics)

    def last_metrics(self) -> dict[str, Any]:
        """The latest value of every metric."""
        return last_metrics(self.metrics)

    def drop_metrics_after(self, step: int) -> None:
        """Forget the rows after ``step``: a resumed run writes them again."""
        drop_rows_after(self.metrics, step)

    @property
    def model_final(self) -> Path:
        """The trained model's state_dict (plain tensors), written by rank 0 at the end."""
        return self.path / "model_final.pt"

    @property
    def model_best(self) -> Path:
        """The weights at the best validation, kept by early stopping (trainer.early_stopping.patience > 0)."""
        return self.path / "model_best.pt"

    @property
    def rank_table(self) -> Path:
        """Every rank's host, ranks, device and rendezvous address, as gathered at start."""
        return self.path / "rank_table.json"

    def write_rank_table(self, rows: Sequence[RankTableEntry]) -> None:
        write_json_atomic(self.rank_table, [row.to_json() for row in rows])

    def rank_table_entries(self) -> list[RankTableEntry]:
        """The ranks' rows of the latest rank table, less what is damaged."""
        return _checked_list(self.rank_table, RankTableEntry, "ranks")[0]

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        """The checkpoint of ``step``; names sort by step (zero-padded)."""
        return self.checkpoints / f"step_{step:09d}.pt"

    @property
    def checkpoint_ledger(self) -> Path:
        """The checkpoints this run wrote, each with its step, size and SHA-256 (``hpc_train.train.checkpoint``):
        loads are verified against it, and pruning deletes only what it lists."""
        return self.status_dir / "checkpoints.json"

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint file, oldest step first."""
        return sorted(self.checkpoints.glob(_CHECKPOINT_GLOB))

    @property
    def profile(self) -> Path:
        """The torch.profiler trace (trainer.profile_steps)."""
        return self.path / "profile"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def tensorboard_run(self) -> Path:
        """Where rank 0's SummaryWriter writes: a folder under tensorboard/ named after the run's overrides, so
        that ``tensorboard --logdir SWEEP_DIR`` names each run by what it changed (``0/tensorboard/trainer.lr=0.1``)
        rather than by its number alone. tensorboard/ itself for a run without overrides."""
        name = ",".join(self.label_overrides()).replace(os.sep, "_")  # a "/" in a value would nest folders
        return self.tensorboard / name[:200] if name else self.tensorboard

    @property
    def plots(self) -> Path:
        """PNG curves of metrics.jsonl (trainer.plots, or ``python -m hpc_train.plot``)."""
        return self.path / "plots"

    # ---- logs ------------------------------------------------------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int, restart: int | None = None) -> Path:
        """The log file of one rank: ``rank_<r>.log``, then ``rank_<r>.restart<k>.log`` after the k-th requeue or
        resume. ``restart=None``: the newest one there is."""
        if restart is None:
            restarts = [int(p.name.split(".restart")[1][:-4]) for p in self.logs.glob(f"rank_{rank}.restart*.log")]
            restart = max(restarts, default=0)
        return self.logs / (f"rank_{rank}.log" if restart == 0 else f"rank_{rank}.restart{restart}.log")

    def follow_log(self, rank: int, out: IO[str]) -> Tail:
        """A ``Tail`` that copies the rank's newest log to ``out`` as it grows."""
        return Tail(self.rank_log(rank), out)

    # ---- attempts -----------------------------------------------------------------------------------------

    def logged_attempts(self) -> int:
        """How many attempts left their rank 0 log here (``rank_0.log``, ``rank_0.restart<k>.log``)."""
        return len([*self.logs.glob("rank_0.log"), *self.logs.glob("rank_0.restart*.log")])

    def next_attempt(self) -> int:
        """For a local launcher about to start the ranks: 0 for a fresh run dir, k when k earlier attempts left
        their rank 0 logs here (the run is being resumed). The launcher hands it to every rank. Worked out by
        ``JobIdentity.next_attempt``."""
        return JobIdentity.next_attempt(self.logged_attempts())

    @property
    def attempts(self) -> Path:
        """One entry per training step the Slurm supervisor ran, whatever it came to."""
        return self.status_dir / "attempts.json"

    def read_attempts(self) -> list[dict[str, Any]]:
        """``attempt_records`` as JSON, for scripts and notebooks that read the records as JSON (hpc_train itself
        reads them typed)."""
        return [attempt.to_json() for attempt in self.attempt_records()]

    def attempt_records(self) -> list[AttemptRecord]:
        """The supervisor's attempts, less what is damaged (``checked_attempts`` says what that is)."""
        return self.checked_attempts()[0]

    def checked_attempts(self) -> tuple[list[AttemptRecord], list[str]]:
        """The supervisor's attempts, less what is damaged, with a line for each damaged record."""
        return _checked_list(self.attempts, AttemptRecord, "attempts")

    def write_attempts(self, attempts: Sequence[AttemptRecord]) -> None:
        write_json_atomic(self.attempts, [a.to_json() for a in attempts])

    @property
    def allocations(self) -> Path:
        """Each Slurm allocation the run held: job id, start and (once it ended) end."""
        return self.status_dir / "allocations.json"

    def read_allocations(self) -> list[dict[str, Any]]:
        """``allocation_records`` as JSON (for scripts; hpc_train reads them typed)."""
        return [allocation.to_json() for allocation in self.allocation_records()]

    def allocation_records(self) -> list[Allocation]:
        return _checked_list(self.allocations, Allocation, "allocations")[0]

    def write_allocations(self, allocations: Sequence[Allocation]) -> None:
        write_json_atomic(self.allocations, [a.to_json() for a in allocations])

    @property
    def bad_nodes(self) -> Path:
        """The nodes blamed for a failure, with why."""
        return self.status_dir / "bad_nodes.json"

    def read_bad_nodes(self) -> list[dict[str, Any]]:
        """``bad_node_records`` as JSON (for scripts; hpc_train reads them typed)."""
        return [node.to_json() for node in self.bad_node_records()]

    def bad_node_records(self) -> list[BadNode]:
        return _checked_list(self.bad_nodes, BadNode, "nodes")[0]

    def add_bad_node(self, host: str, why: str, attempt: int) -> None:
        entries = self.bad_node_records()
        if host not in {e.host for e in entries}:
            entries.append(BadNode(host=host, why=why, attempt=attempt))
            write_json_atomic(self.bad_nodes, [e.to_json() for e in entries])

    @property
    def stragglers(self) -> Path:
        """Rank 0's straggler verdicts, one entry per change (``record_stragglers``)."""
        return self.status_dir / "stragglers.json"

    def straggler_reports(self) -> list[StragglerReport]:
        return _checked_list(self.stragglers, StragglerReport, "verdicts")[0]

    def record_stragglers(self, report: StragglerReport) -> None:
        """The latest window's verdict: it replaces the last entry when it names the same ranks (a span goes on),
        else it is added (a rank named or cleared); the oldest entries go past STRAGGLER_ENTRIES."""
        entries = self.straggler_reports()
        if entries and {r.rank for r in entries[-1].ranks} == {r.rank for r in report.ranks}:
            entries[-1] = report
        else:
            entries.append(report)
        write_json_atomic(self.stragglers, [e.to_json() for e in entries[-STRAGGLER_ENTRIES:]], durable=False)

    @property
    def goodput(self) -> Path:
        """The goodput ledger (``hpc_train.core.goodput``)."""
        return self.status_dir / "goodput.json"

    def read_goodput(self) -> dict[str, Any]:
        return _read_dict(self.goodput)

    def write_goodput(self, ledger: Mapping[str, Any]) -> None:
        write_json_atomic(self.goodput, ledger)

    @property
    def reshapes(self) -> Path:
        """One entry per resubmission on another shape (``hpc_train.launch.reshape``)."""
        return self.status_dir / "reshapes.json"

    def reshape_records(self) -> list[Reshape]:
        return _checked_list(self.reshapes, Reshape, "reshapes")[0]

    def append_reshape(self, entry: Reshape) -> None:
        write_json_atomic(self.reshapes, [e.to_json() for e in [*self.reshape_records(), entry]])

    @property
    def growths(self) -> Path:
        """One entry per stop to come back on more nodes (``runtime.grow``)."""
        return self.status_dir / "growths.json"

    def growth_records(self) -> list[Growth]:
        return _checked_list(self.growths, Growth, "growths")[0]

    def write_growths(self, growths: list[Growth]) -> None:
        write_json_atomic(self.growths, [e.to_json() for e in growths])

    @property
    def restarts(self) -> Path:
        """One entry per attempt that stopped on a signal: restart, step resumed from, step stopped at."""
        return self.status_dir / "restarts.json"

    def read_restarts(self) -> list[dict[str, Any]]:
        """``requeue_records`` as JSON (for scripts; hpc_train reads them typed)."""
        return [entry.to_json() for entry in self.requeue_records()]

    def requeue_records(self) -> list[RequeueEntry]:
        return _checked_list(self.restarts, RequeueEntry, "restarts")[0]

    def append_restart(self, entry: RequeueEntry) -> list[RequeueEntry]:
        """Add an attempt to ``status/restarts.json``; returns the whole history."""
        history = [*self.requeue_records(), entry]
        write_json_atomic(self.restarts, [e.to_json() for e in history])
        return history

    @property
    def trackers(self) -> Path:
        """The experiment tracker runs of this run dir (``TrackerRun``): one per tracker and store."""
        return self.status_dir / "trackers.json"

    def tracker_runs(self) -> list[TrackerRun]:
        return _checked_list(self.trackers, TrackerRun, "trackers")[0]

    def tracker_run(self, tracker: str, store: str) -> TrackerRun | None:
        """The run of ``tracker`` in ``store`` (None: not created yet)."""
        return next((r for r in self.tracker_runs() if (r.tracker, r.store) == (tracker, store)), None)

    @property
    def mirror_status(self) -> Path:
        """Rank 0's latest word on the run's mirror (``MirrorStatus``; ``hpc_train.mirror``)."""
        return self.status_dir / "mirror.json"

    def write_mirror_status(self, status: MirrorStatus) -> None:
        write_json_atomic(self.mirror_status, status.to_json(), durable=False)

    def mirror_state(self) -> MirrorStatus | None:
        return MirrorStatus.salvage(read_json(self.mirror_status))[0]

    @property
    def interrupted(self) -> Path:
        """A local launcher's Ctrl-C (``Interrupted``)."""
        return self.status_dir / "interrupted.json"

    def write_interrupted(self, job_id: str) -> None:
        record = Interrupted(job_id=job_id, time=time.time(), run=str(self.path.resolve()))
        write_json_atomic(self.interrupted, record.to_json())

    def interruption(self) -> Interrupted | None:
        return Interrupted.salvage(read_json(self.interrupted))[0]

    @property
    def pulled(self) -> Path:
        """Where ``jobs pull`` brought this run dir from (``MirrorOrigin``)."""
        return self.status_dir / "pulled.json"

    def write_pulled_from(self, origin: MirrorOrigin) -> None:
        write_json_atomic(self.pulled, origin.to_json())

    def pulled_from(self) -> MirrorOrigin | None:
        return MirrorOrigin.salvage(read_json(self.pulled))[0]

    def checkpointed_tracker_runs(self) -> list[TrackerRun]:
        """The tracker runs the checkpoint ledger names: a copy made at each checkpoint, which keeps the runs'
        ids when ``status/trackers.json`` is lost. Its ``logged_step`` is as of that checkpoint."""
        ledger = self.checkpoint_ledger_record()
        return list(ledger.trackers) if ledger is not None else []

    def checkpoint_ledger_record(self) -> CheckpointLedger | None:
        """The checkpoint ledger (``train.checkpoint`` keeps it); None when there is none, or it is no JSON object.
        A damaged entry is left out of it."""
        return CheckpointLedger.salvage(read_json(self.checkpoint_ledger))[0]

    def write_checkpoint_ledger(self, ledger: CheckpointLedger, durable: bool = True) -> None:
        write_json_atomic(self.checkpoint_ledger, ledger.to_json(), durable)

    def write_tracker_run(self, run: TrackerRun) -> None:
        """Add ``run``, or replace the entry of its tracker and store."""
        others = [r for r in self.tracker_runs() if (r.tracker, r.store) != (run.tracker, run.store)]
        self.status_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.trackers, [r.to_json() for r in [*others, run]])

    # ---- rank states --------------------------------------------------------------------------------------

    @property
    def status_dir(self) -> Path:
        return self.path / "status"

    def status_path(self, rank: int) -> Path:
        return self.status_dir / f"rank_{rank}.json"

    def progress(self, rank: int) -> Path:
        """The steps this attempt made, with the times of its first and latest (and, from the trainer, of its
        latest checkpoint): written by the trainer's rank 0, or by a user's script through
        ``hpc_train.preemption.should_stop(step)``. With a node channel, it is written at the rank's end and the
        node's summary holds it meanwhile."""
        return self.status_dir / f"progress_{rank}.json"

    def read_progress(self, rank: int) -> dict[str, Any]:
        """``progress_record`` as JSON ({} when there is none; for scripts: hpc_train reads it typed)."""
        found = self._newest_progress(rank)
        return found.to_json() if found is not None else {}

    def progress_record(self, rank: int) -> Progress:
        """The steps this attempt made (no steps when there is no record, or a damaged one)."""
        return self._newest_progress(rank) or Progress()

    def _newest_progress(self, rank: int) -> Progress | None:
        """The newest of: this process's node channel, the nodes' summaries and the rank's own file."""
        own = self.node.progress(rank) if self.node is not None else None
        if own is not None:
            return own
        found = [Progress.salvage(read_json(self.progress(rank)))[0]]
        found += [p for summary in self.node_summaries() for p in summary.progress if p.rank == rank]
        return max((p for p in found if p is not None), key=lambda p: p.time or 0.0, default=None)

    def write_progress(self, rank: int, record: Progress | Mapping[str, Any]) -> None:
        """Write a rank's progress (a mapping must hold Progress's keys, of their types: else RecordError)."""
        progress = record if isinstance(record, Progress) else Progress.from_json(record)
        progress = replace(progress, run=str(self.path.resolve()))

        def through(node: NodeChannel) -> bool:
            node.report_progress(rank, progress)
            return True

        if self.node is not None and self._through_node(through):
            return
        # Not fsync'ed: rewritten about once a second while the rank trains.
        write_json_atomic(self.progress(rank), progress.to_json(), durable=False)

    # ---- each node's summary ----------------------------------------------------------------------------------

    def _through_node(self, report: Callable[[NodeChannel], bool]) -> bool:
        """``report`` through this rank's node channel; False when the node's folder failed (memory full, gone):
        the caller then writes the record to the run dir itself, as a rank without a channel does."""
        assert self.node is not None
        try:
            return report(self.node)
        except OSError as exc:
            log.warning(
                "hpc_train: the node's status folder %s failed (%s): writing to the run dir", self.node.folder, exc
            )
            return False

    def node_summary(self, host: str) -> Path:
        """The summary of the node ``host`` (``hpc_train.core.nodes``): the one place its name is made."""
        return self.status_dir / NODE_SUMMARY.format(host=host)

    def node_summary_paths(self) -> list[Path]:
        """Every node's summary file, sorted: the one place they are found."""
        return sorted(self.status_dir.glob(NODE_SUMMARY.format(host="*")))

    def with_node(self, *, job: str, local_ranks: int) -> RunDir:
        """This run dir, its ranks' statuses and progress going through this node (``hpc_train.core.nodes``):
        ``job`` names the attempt (each has a node folder of its own), ``local_ranks`` the node's ranks. Where no
        node-local folder can be made, the rank writes its own files, as before, and says so."""
        try:
            channel = NodeChannel.open(self.path, self.node_summary, job=job, local_ranks=local_ranks)
        except OSError as exc:
            log.warning("hpc_train: no node-local status folder (%s): this rank writes status/rank_<r>.json", exc)
            return self
        return replace(self, node=channel)

    def startup_profiles(self) -> dict[int, StartupProfile]:
        """Where each rank's start-up went, from the newest node summary that has it."""
        profiles: dict[int, StartupProfile] = {}
        for summary in sorted(self.node_summaries(), key=lambda s: s.time):
            profiles.update((p.rank, p) for p in summary.startup)
        return profiles

    def node_summaries(self) -> list[NodeSummary]:
        """Every node's latest summary that is whole (``checked_statuses`` lists the damaged ones)."""
        if self._held is not None:
            return list(self._held)
        found = (NodeSummary.salvage(read_json(p))[0] for p in self.node_summary_paths())
        return [summary for summary in found if summary is not None]

    @contextmanager
    def summaries_held(self) -> Iterator[RunDir]:
        """Within the block, the nodes' summaries are read once: for a reader that takes several views of one
        moment (``jobs status``: the state, the progress, the nodes heard, the start-up), at 1,024 nodes each
        read is a thousand files."""
        object.__setattr__(self, "_held", tuple(self.node_summaries()))
        try:
            yield self
        finally:
            object.__setattr__(self, "_held", None)

    @property
    def batch_exit(self) -> Path:
        """srun's exit status as the sbatch script's teardown saw it."""
        return self.path / BATCH_EXIT

    def batch_exit_record(self) -> BatchExit | None:
        """How the job script's supervisor ended; None before it did (or when the record is damaged)."""
        return BatchExit.salvage(read_json(self.batch_exit))[0]

    def write_batch_exit(self, record: BatchExit) -> None:
        write_json_atomic(self.batch_exit, record.to_json())

    def write_status(self, rank: int, state: RankState | str, *, attempt: int | None = None, **extra: Any) -> None:
        """Record a rank's state with its host and pid (a string must name a RankState). ``attempt``: the
        supervisor's number for this training step (``JobIdentity.attempt``), kept when given. ``extra`` holds
        more of RankStatus's keys, of their types (else RecordError), and any others to carry.

        With a node channel the status goes to the node; the last word of rank 0 and of a rank that failed also
        gets a file of its own (``status/rank_<r>.json``, with rank 0's progress): what scripts and people look
        for first, a file per exception rather than per rank. So does any rank's last word that could not reach
        its node's summary."""
        record = {
            "rank": rank,
            "state": RankState(state).value,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
            "run": str(self.path.resolve()),  # whose record this is, for clear_statuses
        }
        started = process_start(os.getpid())  # tells this process from a later one given the same pid
        if started is not None:  # None without /proc
            record["pid_start"] = started
        if attempt is not None:
            record["attempt"] = attempt
        status = RankStatus.from_json({**record, **extra})
        if self.node is not None:
            # Read before the report: the last rank of the node to end empties the node's folder.
            progress = self.node.progress(rank) if not status.state.live else None
            summarised = self._through_node(lambda node: node.report(status))
            if summarised and (status.state.live or (rank != 0 and status.state is not RankState.FAILED)):
                return
            if progress is not None:
                write_json_atomic(self.progress(rank), replace(progress, rank=None).to_json(), durable=False)
        # Not fsync'ed: a status is a heartbeat, rewritten every logged row; an atomic rename is all readers need.
        write_json_atomic(self.status_path(rank), status.to_json(), durable=False)

    def write_failure(
        self, rank: int, error: str | BaseException, detail: str | None = None, *, attempt: int | None = None
    ) -> None:
        """Record that a rank failed, with the last step it reported (its heartbeat) and a traceback: the
        exception's, or its ``detail`` when it carries one (a user script's own stderr). ``attempt`` as for
        ``write_status``."""
        extra: dict[str, Any] = {}
        if isinstance(error, BaseException):
            step_of_failure = failed_step(error)  # the trainer's step when it raised
            if step_of_failure is not None:
                extra["failed_step"] = step_of_failure
            carried = getattr(error, "detail", None)
            if detail is None:
                detail = carried if isinstance(carried, str) else "".join(traceback.format_exception(error)[-12:])
            error = f"{type(error).__name__}: {error}"
        # A script's rank may have no step; a damaged record, none.
        status = self.node.status(rank) if self.node is not None else self._status(self.status_path(rank))
        step = status.step if status is not None and status.step is not None else 0
        self.write_status(
            rank, RankState.FAILED, attempt=attempt, error=error, traceback=detail or "", step=step, **extra
        )

    @property
    def cancel_request(self) -> Path:
        """``jobs cancel`` of this run alone, while it shares a Slurm job with others (``cluster.pack``): its
        supervisor ends its training step and starts no other; the pack skips it after a requeue."""
        return self.status_dir / "cancel.json"

    def request_cancel(self) -> None:
        self.status_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.cancel_request, {"time": time.time(), "host": socket.gethostname()})

    def cancel_requested(self) -> bool:
        return self.cancel_request.is_file()

    @property
    def restart_request(self) -> Path:
        """The supervisor stopped the training step to go on in the same allocation without a node
        (``cluster.stragglers.replace_after_s``): the ranks checkpoint and do not requeue the job."""
        return self.status_dir / "restart.json"

    def request_restart(self, node: BadNode) -> None:
        write_json_atomic(self.restart_request, node.to_json())

    def restart_requested(self) -> BadNode | None:
        """The node the step was stopped to leave (None: no request, or a damaged one)."""
        return BadNode.salvage(read_json(self.restart_request))[0] if self.restart_request.is_file() else None

    def clear_restart_request(self) -> None:
        self.restart_request.unlink(missing_ok=True)

    def clear_statuses(self) -> None:
        """Forget the ranks' states of an earlier attempt (before a resubmission), so that nobody mistakes a
        pid of the last attempt for a rank of this one."""
        own = [*self.status_dir.glob("rank_*.json"), *self.status_dir.glob("progress_*.json")]
        for path in [*own, *self.node_summary_paths(), self.interrupted]:
            if self._wrote(path):
                path.unlink(missing_ok=True)
        self.batch_exit.unlink(missing_ok=True)

    def _wrote(self, path: Path) -> bool:
        """Whether this run wrote the record in ``path``: it names this run dir, or, written before records
        did, it is a plain file in a status/ folder that is the run dir's own (not a link to a shared one).
        A file someone else put there, or a link, is never deleted."""
        if path.is_symlink() or not path.is_file():
            return False
        record = read_json(path)
        owner = record.get("run") if isinstance(record, dict) else None
        if owner is not None:
            return bool(owner == str(self.path.resolve()))
        return not self.status_dir.is_symlink()

    def read_statuses(self) -> dict[int, dict[str, Any]]:
        """``rank_statuses`` as JSON, for scripts and notebooks that read the records as JSON (hpc_train itself
        reads them typed)."""
        return {rank: status.to_json() for rank, status in self.rank_statuses().items()}

    @staticmethod
    def _status(path: Path) -> RankStatus | None:
        return RankStatus.salvage(read_json(path))[0]

    def rank_statuses(self) -> dict[int, RankStatus]:
        """The latest status of each rank that has written a whole one (a value of the wrong type is left out),
        from its node's summary or its own file, whichever is newer."""
        found = (self._status(path) for path in sorted(self.status_dir.glob("rank_*.json")))
        newest = {status.rank: status for status in found if status is not None}
        return _with_newer(newest, self._summarised().values())

    def _summarised(self) -> dict[int, RankStatus]:
        """Each rank's newest status in the nodes' summaries (a rank moved to another node in a later attempt
        appears in two)."""
        newest: dict[int, RankStatus] = {}
        for summary in self.node_summaries():
            for status in summary.ranks:
                if status.rank not in newest or (status.time or 0.0) > (newest[status.rank].time or 0.0):
                    newest[status.rank] = status
        return newest

    def checked_statuses(self) -> tuple[dict[int, RankStatus], list[str]]:
        """Each rank's latest status (what ``rank_statuses`` reads), less what is damaged, with a line for each
        damaged record: a file that is no JSON object, names no rank or state, or holds a value of the wrong
        type (``RankStatus.KEYS`` says what each key holds)."""
        statuses: dict[int, RankStatus] = {}
        damaged: list[str] = []
        for path in sorted(self.status_dir.glob("rank_*.json")):
            record, unreadable = _load(path)
            if unreadable:
                damaged.append(unreadable)
                continue
            status, problems = RankStatus.salvage(record)
            damaged += [f"{path}: {problem}" + ("" if status is not None else ": ignored") for problem in problems]
            if status is not None:
                if path.name != self.status_path(status.rank).name:
                    damaged.append(f"{path}: says rank {status.rank}, which is not the rank its name says")
                statuses[status.rank] = status
        for path in self.node_summary_paths():
            record, unreadable = _load(path)
            if record is None and not unreadable:  # gone since the listing
                continue
            summary, problems = NodeSummary.salvage(record) if not unreadable else (None, [unreadable])
            damaged += [problem if problem.startswith(str(path)) else f"{path}: {problem}" for problem in problems]
            _with_newer(statuses, summary.ranks if summary is not None else ())
        return statuses, damaged
