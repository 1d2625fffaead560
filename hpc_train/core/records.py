"""The records a run keeps in its ``status/`` folder, typed: one frozen, keyword-only dataclass each.

The JSON on disk is a contract (users' run dirs, ``jobs status --json``, scripts and tests read it), so
``to_json`` writes the keys and value types hpc_train has always written, and ``from_json`` reads what earlier
versions wrote: a key they did not write yet is optional. A value of the wrong type is refused with a
``RecordError`` that names the key, the value and what it should hold. ``salvage`` keeps what is whole of a
damaged record and says what was not: that is what ``jobs status`` lists under "damaged records".

    status/node_<host>.json    NodeSummary: the RankStatus and Progress of each rank of one node
    status/rank_<r>.json       RankStatus (its state a RankState)
    status/progress_<r>.json   Progress
    status/attempts.json       [AttemptRecord]: its AttemptOutcome, its Progress, and its Failure if it failed
    status/allocations.json    [Allocation]
    status/restarts.json       [RequeueEntry]
    status/bad_nodes.json      [BadNode]
    status/growths.json        [Growth]
    status/trackers.json       [TrackerRun]
    status/mirror.json         MirrorStatus (and the mirror's own ledger, mirror.json there: MirrorLedger)

``RunDir`` (``hpc_train.core.rundir``) reads and writes them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from hpc_train.core.textutil import asked_for, first_few

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; only for annotations, which are not evaluated

__all__ = [
    "FATAL_KINDS",
    "RETRYABLE_KINDS",
    "Allocation",
    "AttemptOutcome",
    "AttemptRecord",
    "BadNode",
    "BatchExit",
    "CheckpointLedger",
    "CheckpointRecord",
    "Failure",
    "FailureKind",
    "Growth",
    "Interrupted",
    "JobRecord",
    "LeaseRecord",
    "LeaseWatcher",
    "MirrorLedger",
    "MirrorOrigin",
    "MirrorStatus",
    "MirroredFile",
    "NodeSummary",
    "PackPlace",
    "Progress",
    "RankCompute",
    "RankState",
    "RankStatus",
    "RankTableEntry",
    "RecordError",
    "RequeueEntry",
    "Reshape",
    "ScalingPoint",
    "ScalingStudy",
    "SlowRank",
    "StartupProfile",
    "StragglerReport",
    "TrackerRun",
]


class RecordError(ValueError):
    """A record read from a run dir lacks a key it needs or holds a value of the wrong type."""

    def __init__(self, record: str, problems: list[str]) -> None:
        super().__init__(f"damaged {record} record: {'; '.join(problems)}")
        self.problems = problems


class _Text(str, enum.Enum):
    """Written to JSON as its plain string value, which ``str`` gives too (enum.StrEnum needs Python 3.11)."""

    def __str__(self) -> str:
        return str(self.value)


class RankState(_Text):
    """A rank's state."""

    STARTING = "starting"
    """Process started, before the rendezvous (slow imports, dataset)."""
    RUNNING = "running"
    """Past the rendezvous; the status is rewritten at every logged step."""
    COMPLETED = "completed"
    """Trained to the end (or the user's script exited 0)."""
    FAILED = "failed"
    """Raised, or was ended by its watchdog; the status holds the error and a traceback."""
    STOPPED = "stopped"
    """Checkpointed on a signal (and requeued, on Slurm, within the limits)."""

    @property
    def live(self) -> bool:
        """Still expected to report more."""
        return self in (RankState.STARTING, RankState.RUNNING)


class FailureKind(_Text):
    """What a failed training step died of (``hpc_train.runtime.failures.classify``)."""

    KILLED = "killed"
    """A rank ended by a signal (out of memory, scancel of a step, a node's kill), or without a word."""
    NODE_LOST = "node_lost"
    COLLECTIVE = "collective"
    """A collective or rendezvous error: usually a peer that died first."""
    HANG = "hang"
    """A rank the watchdog ended: no step for trainer.watchdog_s."""
    EXCEPTION = "exception"
    """A Python exception, the first time it is seen."""
    UNKNOWN = "unknown"
    REPEATED_EXCEPTION = "repeated_exception"
    """The same exception from the same step as the attempt before: fatal."""
    IMPORT = "import"
    CONFIG = "config"
    DIVERGED = "diverged"
    """A non-finite loss or state (the last finite one is kept)."""

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE_KINDS


RETRYABLE_KINDS = (
    FailureKind.KILLED,
    FailureKind.NODE_LOST,
    FailureKind.COLLECTIVE,
    FailureKind.HANG,
    FailureKind.EXCEPTION,
    FailureKind.UNKNOWN,
)
FATAL_KINDS = (FailureKind.REPEATED_EXCEPTION, FailureKind.IMPORT, FailureKind.CONFIG, FailureKind.DIVERGED)


class AttemptOutcome(_Text):
    """What one training step the supervisor ran came to (``status/attempts.json``); JSON holds the value."""

    RUNNING = "running"
    COMPLETED = "completed"
    STOPPED = "stopped"
    """On a stop signal: the ranks checkpointed (and requeued the job, within the limits)."""
    FAILED = "failed"
    """A retryable failure (its ``failure`` says which); the supervisor may start another attempt."""
    FATAL = "fatal"
    """A failure that is not retried or requeued: the job ended with ExitCode.FATAL."""
    GAVE_UP = "gave_up"
    """Retryable, but the limits were spent or no healthy node was left: the job ended with ExitCode.GAVE_UP."""
    LOST = "lost"
    """Its batch step was killed before it could record how the attempt ended."""


# ---- what a key may hold ----------------------------------------------------------------------------------------


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _or_none(valid: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or valid(value)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Key:
    """What one key of a record may hold, and how the field is made from it."""

    says: str
    """What the report says of a wrong value: ``key=value <says>``."""
    valid: Callable[[Any], bool]
    read: Callable[[Any], Any] = _same
    required: bool = False
    nested: type[_Record] | None = None
    """A record of its own (a JSON object, or null): checked key by key, and read with its ``from_json``."""


def _nested(record: type[_Record]) -> _Key:
    return _Key("is not a JSON object", _or_none(lambda v: isinstance(v, dict)), record.from_json, nested=record)


def _plain(value: Any) -> Any:
    """A field's value as JSON holds it."""
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


class _Record:
    """``to_json``, ``from_json`` and ``salvage`` for a dataclass whose fields are its JSON keys (``KEYS``)."""

    KEYS: ClassVar[Mapping[str, _Key]]
    NULLS: ClassVar[frozenset[str]] = frozenset()
    """Keys written even when their value is None (as JSON null); other None fields are left out."""
    RENAMED: ClassVar[Mapping[str, str]] = {}
    """Keys of records written by earlier versions, and the key each is read as now. The old key's value wins:
    a rank status written before the rename holds both ``restart`` (the attempt number) and ``attempt`` (then only
    the supervisor's, else none)."""

    @classmethod
    def _current(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` with its keys as this version names them (``RENAMED``)."""
        current = dict(data)
        for old, new in cls.RENAMED.items():
            if old in current:
                current[new] = current.pop(old)
        return current

    @classmethod
    def clean(cls, data: object) -> tuple[dict[str, Any] | None, list[str]]:
        """``data`` less the keys whose value is of the wrong type, with a line for each (None when ``data`` is
        no JSON object). Keys this record does not know are kept."""
        if not isinstance(data, Mapping):
            return None, [f"holds a JSON {type(data).__name__}, not an object"]
        data = cls._current(data)
        clean, problems = dict(data), []
        for key, spec in cls.KEYS.items():
            if key not in data:
                continue
            value = data[key]
            found = [f"{key}={value!r:.80} {spec.says}"] if not spec.valid(value) else []
            if not found and spec.nested is not None and value is not None:
                found = [f"{key}.{problem}" for problem in spec.nested.salvage(value)[1]]
            if found:
                problems += found
                del clean[key]
        return clean, problems

    @classmethod
    def salvage(cls, data: object) -> tuple[Self | None, list[str]]:
        """The record in ``data`` without the values of the wrong type, and what was wrong; None when it is no
        JSON object, or a key it needs is missing or wrong."""
        clean, problems = cls.clean(data)
        if clean is None or not isinstance(data, Mapping):
            return None, problems
        needed = [key for key, spec in cls.KEYS.items() if spec.required and key not in clean]
        if needed:
            return None, problems + [f"{key} is missing" for key in needed if key not in cls._current(data)]
        values = {key: spec.read(clean.pop(key)) for key, spec in cls.KEYS.items() if key in clean}
        return cls._make(values, clean), problems

    @classmethod
    def _make(cls, values: dict[str, Any], unknown: dict[str, Any]) -> Self:
        """The record of the known keys' ``values``; the keys it does not know are dropped."""
        return cls(**values)

    @classmethod
    def from_json(cls, data: object) -> Self:
        """The record in ``data`` (a JSON object); RecordError when a value is of the wrong type."""
        record, problems = cls.salvage(data)
        if record is None or problems:
            raise RecordError(cls.__name__, problems)
        return record

    def to_json(self) -> dict[str, Any]:
        """The JSON object that holds the record."""
        values = {key: getattr(self, key) for key in self.KEYS}
        return {key: _plain(value) for key, value in values.items() if value is not None or key in self.NULLS}

    if TYPE_CHECKING:

        def __init__(self, **values: Any) -> None: ...


def _is(choices: type[enum.Enum]) -> Callable[[Any], bool]:
    return lambda value: value in {c.value for c in choices}


_STEP = _Key("is not a step number", _or_none(_integer))
_TIME = _Key("is not a time stamp", _or_none(_number))
_SECONDS = _Key("is not a number of seconds", _or_none(_number))
_HOSTS = _Key("is not a list of hosts", _strings, tuple)


# ---- the records ------------------------------------------------------------------------------------------------


class _Process(_Record):
    """A record that names a process by its pid and start time (a pid is reused, a (pid, start) pair is not)."""

    @classmethod
    def clean(cls, data: object) -> tuple[dict[str, Any] | None, list[str]]:
        """As ``_Record.clean``; a ``pid_start`` of the wrong type takes its ``pid`` along: that pid alone would
        pass for whatever process has it now, and a start time that matches none names no running process."""
        clean, problems = super().clean(data)
        if clean is not None and isinstance(data, Mapping) and "pid_start" in data and "pid_start" not in clean:
            clean.pop("pid", None)
        return clean, problems


@dataclass(frozen=True, kw_only=True)
class Progress(_Record):
    """The steps one attempt made, with their times (``status/progress_<r>.json``, and each attempt's copy):
    written by the trainer's rank 0, or by a user's script through ``hpc_train.preemption.should_stop(step)``."""

    first_step: int | None = None
    """The first step this attempt made: one past the step it resumed from."""
    first_time: float | None = None
    """When that step was done (0: not yet)."""
    step: int | None = None
    """The latest step, done at ``time``."""
    time: float | None = None
    checkpoint_step: int | None = None
    """The latest checkpoint's step and when it was complete (the trainer only)."""
    checkpoint_time: float | None = None
    checkpoint_s: float | None = None
    """The slowest checkpoint of this attempt: seconds from the save's start until it was durable (the trainer
    only; ``hpc_train.runtime.timeouts`` sets the signal lead from it)."""
    stop_agreed: bool | None = None
    """A user's script: ``step`` is the one where the ranks agreed to stop."""
    attempt: int | None = None
    """A user's script: the attempt it belongs to."""
    run: str | None = None
    """The run dir that wrote it (``RunDir.clear_statuses`` deletes only its own)."""
    rank: int | None = None
    """Whose it is, in a node's summary (``NodeSummary.progress``)."""
    steps_total: int | None = None
    """A user's script: the optimizer steps the run trains in all, as it told ``GlobalBatch.of``."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "first_step": _STEP,
        "first_time": _TIME,
        "step": _STEP,
        "time": _TIME,
        "checkpoint_step": _STEP,
        "checkpoint_time": _TIME,
        "checkpoint_s": _SECONDS,
        "stop_agreed": _Key("is not true or false", _or_none(lambda v: isinstance(v, bool))),
        "attempt": _Key("is not an attempt number", _or_none(_integer)),
        "run": _Key("is not a run dir's path", _or_none(_string)),
        "rank": _Key("is not a rank number", _or_none(_integer)),
        "steps_total": _STEP,
    }


@dataclass(frozen=True, kw_only=True)
class Failure(_Record):
    """What a failed training step died of (``hpc_train.runtime.failures.classify``), in its attempt's record."""

    kind: FailureKind
    rank: int | None = None
    host: str = ""
    error: str = ""
    traceback: str = ""
    step: int | None = None
    suspects: tuple[str, ...] = ()
    """Hosts blamed: a killed rank's, a lost node, a frozen rank's."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "kind": _Key(
            f"is none of {', '.join(k.value for k in FailureKind)}", _is(FailureKind), FailureKind, required=True
        ),
        "rank": _Key("is not a rank number", _or_none(_integer)),
        "host": _Key("is not a host name", _string),
        "error": _Key("is not a string", _string),
        "traceback": _Key("is not a string", _string),
        "step": _STEP,
        "suspects": _HOSTS,
    }
    NULLS = frozenset({"rank", "step"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FailureKind(self.kind))  # Failure(kind="killed") reads as the member

    @property
    def retryable(self) -> bool:
        return self.kind.retryable

    def same_as(self, earlier: Failure | None) -> bool:
        """The same Python exception from the same step as ``earlier`` (the last attempt's failure)."""
        return (
            earlier is not None
            and earlier.kind in (FailureKind.EXCEPTION, FailureKind.REPEATED_EXCEPTION)
            and earlier.error == self.error
            and earlier.step == self.step
        )

    def describe(self) -> str:
        where = f"rank {self.rank} on {self.host}" if self.rank is not None else self.host or "the step"
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{self.kind} ({'retryable' if self.retryable else 'fatal'}): {where}{at}: {self.error}"

    def to_json(self) -> dict[str, Any]:
        """With ``retryable`` and ``describe``, for readers of the file (they are not read back)."""
        return {**super().to_json(), "retryable": self.retryable, "describe": self.describe()}


@dataclass(frozen=True, kw_only=True)
class AttemptRecord(_Record):
    """One training step the Slurm supervisor ran (``status/attempts.json``), whatever it came to."""

    attempt: int
    outcome: AttemptOutcome
    job_id: str = ""
    """The Slurm job it ran in (``<array job>_<index>`` for an array element)."""
    requeue: int = 0
    """Slurm's restart count of that job: a requeue keeps the job id, so the two name the allocation."""
    nodes: tuple[str, ...] = ()
    ranks: int | None = None
    """How many ranks it ran (None in records written before it was kept): fewer than the config's when the job
    went on with fewer nodes (``cluster.min_nodes``)."""
    start: float | None = None
    end: float | None = None
    """None while it runs."""
    script: bool = False
    """A user's script ran, rather than the trainer: its progress is its steps, not its checkpoints."""
    exit_code: int | None = None
    """srun's exit status, once it ended."""
    progress: Progress | None = None
    """Rank 0's progress when the attempt ended."""
    failure: Failure | None = None
    message: str | None = None
    """Why the supervisor gave up, or why the attempt was closed by the next allocation."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "attempt": _Key("is not an attempt number", _integer, required=True),
        "outcome": _Key(
            "is not an outcome (running, completed, stopped, failed, ...)",
            _is(AttemptOutcome),
            AttemptOutcome,
            required=True,
        ),
        "job_id": _Key("is not a job id", _string),
        "requeue": _Key("is not a restart count", _integer),
        "nodes": _HOSTS,
        "ranks": _Key("is not a rank count", _integer),
        "start": _TIME,
        "end": _TIME,
        "script": _Key("is not true or false", lambda v: isinstance(v, bool)),
        "exit_code": _Key("is not an exit status", _integer),
        "progress": _nested(Progress),
        "failure": _nested(Failure),
        "message": _Key("is not a string", _string),
    }
    NULLS = frozenset({"end"})

    @property
    def allocation(self) -> tuple[str, int]:
        """Which allocation it ran in: the job id and Slurm's restart count."""
        return self.job_id, self.requeue


@dataclass(frozen=True, kw_only=True)
class Allocation(_Record):
    """One Slurm allocation the run held (``status/allocations.json``): the goodput ledger's wall time."""

    job_id: str = ""
    requeue: int = 0
    nodes: tuple[str, ...] = ()
    start: float
    end: float | None = None
    """None while the job holds it."""
    min_nodes: int | None = None
    """The node range the job asked Slurm for (``cluster.min_nodes``, spares on top); None for a fixed count,
    which ``nodes`` is."""
    max_nodes: int | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "job_id": AttemptRecord.KEYS["job_id"],
        "requeue": AttemptRecord.KEYS["requeue"],
        "nodes": _HOSTS,
        "start": _Key("is not a time stamp", _number, required=True),
        "end": _TIME,
        "min_nodes": _Key("is not a node count", _or_none(_integer)),
        "max_nodes": _Key("is not a node count", _or_none(_integer)),
    }
    NULLS = frozenset({"end"})

    @property
    def allocation(self) -> tuple[str, int]:
        return self.job_id, self.requeue

    @property
    def asked(self) -> str:
        """'asked for 2-8 nodes, got 4' for a job that asked for a range; '' for a fixed count."""
        if self.min_nodes is None or self.max_nodes is None:
            return ""
        return asked_for(self.min_nodes, self.max_nodes, len(self.nodes))


@dataclass(frozen=True, kw_only=True)
class RequeueEntry(_Record):
    """An attempt that stopped on the preemption signal and asked to be requeued (``status/restarts.json``)."""

    attempt: int
    """The attempt's number (``restart`` in records written before)."""
    resumed_step: int | None = None
    """The step it resumed from, and the one it stopped at (None: a user's script that reports no steps)."""
    stopped_step: int | None = None
    signal: int
    time: float | None = None
    stop_saved_s: float | None = None
    """Seconds from the signal to the durable checkpoint the attempt stopped with (rank 0's count)."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "attempt": _Key("is not an attempt number", _integer, required=True),
        "resumed_step": _STEP,
        "stopped_step": _STEP,
        "signal": _Key("is not a signal number", _integer, required=True),
        "time": _TIME,
        "stop_saved_s": _SECONDS,
    }
    NULLS = frozenset({"resumed_step", "stopped_step"})
    RENAMED: ClassVar[Mapping[str, str]] = {"restart": "attempt"}


@dataclass(frozen=True, kw_only=True)
class Reshape(_Record):
    """A change of the run's shape (``status/reshapes.json``): from what, onto what. A resubmission of the run dir
    on another shape, or an attempt the supervisor ran on fewer nodes after losing one (``why`` says which)."""

    was: str
    """The shape the run was trained on, as ``config.shape.Shape.describe`` says it."""
    onto: str
    time: float | None = None
    why: str = ""
    """Why the shape changed, when hpc_train changed it (a node lost); empty for a resubmission."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "was": _Key("is not a string", _string, required=True),
        "onto": _Key("is not a string", _string, required=True),
        "time": _TIME,
        "why": _Key("is not a string", _string),
    }


@dataclass(frozen=True, kw_only=True)
class Growth(_Record):
    """A job on fewer nodes than cluster.nodes that stopped to come back on more, because more would start at once
    and the work left was worth the cost (``status/growths.json``; ``runtime.grow``): the decision and its
    estimate. The goodput ledger measures what it really cost."""

    time: float
    """When the supervisor decided (and signalled the ranks to checkpoint)."""
    job_id: str = ""
    attempt: int | None = None
    step: int | None = None
    """Rank 0's step at the decision (its progress record carried forward to then: ``runtime.grow.step_now``)."""
    nodes_before: int
    nodes_expected: int
    """The count that would have started at once (the requeued job asks for the range again)."""
    steps_left: int | None = None
    step_s_before: float | None = None
    step_s_after: float | None = None
    cost_s: float | None = None
    """Estimated: the stop's checkpoint, the requeue's gap and a start-up."""
    gain_s: float | None = None
    """Estimated: the steps left, each that much faster."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "time": _Key("is not a time stamp", _number, required=True),
        "job_id": _Key("is not a job id", _string),
        "attempt": _Key("is not an attempt number", _or_none(_integer)),
        "step": _STEP,
        "nodes_before": _Key("is not a node count", _integer, required=True),
        "nodes_expected": _Key("is not a node count", _integer, required=True),
        "steps_left": _STEP,
        "step_s_before": _SECONDS,
        "step_s_after": _SECONDS,
        "cost_s": _SECONDS,
        "gain_s": _SECONDS,
    }


@dataclass(frozen=True, kw_only=True)
class TrackerRun(_Record):
    """The experiment tracker run that holds a run dir (``status/trackers.json``): created once, before the first
    attempt, and reused by every later one (requeue, restart, resubmission, another shape)."""

    tracker: str
    """mlflow or wandb."""
    store: str
    """Where the run lives: MLflow's tracking URI; W&B's entity/project (entity empty for the default)."""
    run_id: str
    experiment: str = ""
    """MLflow: the experiment's name."""
    logged_step: int | None = None
    """The latest step rank 0 has logged to it: a resumed attempt does not log the steps it trains again."""
    created: float | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "tracker": _Key("is not a tracker name", _string, required=True),
        "store": _Key("is not a string", _string, required=True),
        "run_id": _Key("is not a run id", _string, required=True),
        "experiment": _Key("is not a string", _string),
        "logged_step": _STEP,
        "created": _TIME,
    }


@dataclass(frozen=True, kw_only=True)
class BadNode(_Record):
    """A node blamed for a failure (``status/bad_nodes.json``): later attempts leave it out when spares allow."""

    host: str
    why: str = ""
    attempt: int | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "host": _Key("is not a host name", _string, required=True),
        "why": _Key("is not a string", _string),
        "attempt": _Key("is not an attempt number", _or_none(_integer)),
    }


@dataclass(frozen=True, kw_only=True)
class RankStatus(_Process):
    """What a rank says about itself (``status/rank_<r>.json``): its state, host and process, rewritten at every
    logged step while it trains (a heartbeat), and at its end."""

    rank: int
    state: RankState
    host: str | None = None
    pid: int | None = None
    pid_start: int | None = None
    """When the process started, in clock ticks since boot: with the pid, it names one process."""
    time: float | None = None
    run: str | None = None
    """The run dir that wrote it (``RunDir.clear_statuses`` deletes only its own)."""
    attempt: int | None = None
    """The attempt of the run dir that wrote it (``JobIdentity.attempt``; ``restart`` in records written before)."""
    step: int | None = None
    failed_step: int | None = None
    """The trainer's step when it raised (or the last step a user's script reported)."""
    error: str | None = None
    traceback: str | None = None
    signal: int | None = None
    """The stop signal a stopped rank checkpointed on."""
    requeued: str | None = None
    """What ``scontrol requeue`` was asked to requeue."""
    stop_saved_s: float | None = None
    """Seconds from the stop signal to the durable checkpoint a stopped rank stopped with."""
    note: str | None = None
    """A doubt about a rank that completed: a user's script that exited 0 with no sign of having trained."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys the record does not name (the peak GPU memory, ``cuda_max_mem_mb``): written as they are."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "rank": _Key("is not a rank number", lambda v: _integer(v) and v >= 0, required=True),
        "state": _Key(f"is none of {', '.join(s.value for s in RankState)}", _is(RankState), RankState, required=True),
        "host": _Key("is not a host name", _string),
        "pid": _Key("is not a process id", lambda v: _integer(v) and v > 0),
        "pid_start": _Key("is not an integer (clock ticks since boot)", _integer),
        "time": _Key("is not a time stamp (seconds since the epoch)", _number),
        "run": _Key("is not a run dir's path", _string),
        "attempt": _Key("is not an attempt number", _integer),
        "step": _STEP,
        "failed_step": _Key("is not a step number", _integer),
        "error": _Key("is not a string", _string),
        "traceback": _Key("is not a string", _string),
        "signal": _Key("is not a signal number", _integer),
        "requeued": _Key("is not a job id", _string),
        "stop_saved_s": _SECONDS,
        "note": _Key("is not a string", _string),
    }
    RENAMED: ClassVar[Mapping[str, str]] = {"restart": "attempt"}

    @classmethod
    def _make(cls, values: dict[str, Any], unknown: dict[str, Any]) -> Self:
        return cls(**values, extra=unknown)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), **self.extra}


def _records(record: type[_Record]) -> _Key:
    """A list of records of their own: a value of the wrong type in an entry is dropped (``salvage``); an entry
    that is no record at all makes the whole list wrong."""

    def read(entries: list[Any]) -> tuple[_Record, ...]:
        return tuple(r for r in (record.salvage(e)[0] for e in entries) if r is not None)

    return _Key(
        f"is not a list of {record.__name__} records",
        lambda v: isinstance(v, list) and all(record.salvage(e)[0] is not None for e in v),
        read,
    )


@dataclass(frozen=True, kw_only=True)
class StartupProfile(_Record):
    """Where one rank's start-up went, phase by phase, in seconds (``NodeSummary.startup``, and the rank's log).
    A phase the rank did not go through (a user's script builds no model) is None."""

    rank: int
    host: str = ""
    interpreter_s: float | None = None
    """From the process's start to the worker's first line: the interpreter and hpc_train's own imports."""
    resolve_s: float | None = None
    """Rank resolution, the node channel and the first status."""
    imports_s: float | None = None
    """The config, torch and the device."""
    rendezvous_s: float | None = None
    """The TCP store: mostly the wait for every other rank to arrive."""
    process_group_s: float | None = None
    """init_process_group, the preflight's first all-reduce and the rank table (collectives: with waits)."""
    data_s: float | None = None
    """The datasets and loaders (the user's dataset, or the synthetic one)."""
    model_s: float | None = None
    """The model built and wrapped (DDP), the optimizer, the resume and the rest of the trainer."""
    first_step_s: float | None = None
    """The first optimizer step."""
    script_s: float | None = None
    """A user's script (instead of every phase from imports on): from the end of rank resolution to the first
    step the script reported (``hpc_train.preemption`` or an integration's callback). Its imports, process
    group, data and model are inside it: hpc_train does not see into the script's process."""

    PHASES: ClassVar[tuple[str, ...]] = (
        "interpreter",
        "resolve",
        "imports",
        "rendezvous",
        "process_group",
        "data",
        "model",
        "first_step",
        "script",
    )
    OWN: ClassVar[tuple[str, ...]] = ("resolve", "process_group", "model")
    """hpc_train's own work: not the interpreter, the imports, the wait at the rendezvous, the data set (the
    user's) nor the first step's compute. (The process group's collectives wait for the slowest rank.)"""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "rank": _Key("is not a rank number", _integer, required=True),
        "host": _Key("is not a host name", _string),
        **{f"{phase}_s": _SECONDS for phase in PHASES},
    }

    def seconds(self, phase: str) -> float | None:
        value: float | None = getattr(self, f"{phase}_s")
        return value

    @property
    def own_s(self) -> float:
        return sum(self.seconds(p) or 0.0 for p in self.OWN)

    @property
    def total_s(self) -> float:
        return sum(self.seconds(p) or 0.0 for p in self.PHASES)

    def describe(self) -> str:
        """``start-up 4.2 s: interpreter 0.3, resolve 0.01, ... (hpc_train's own 0.21 s)``."""
        done = [(p.replace("_", " "), self.seconds(p)) for p in self.PHASES if self.seconds(p) is not None]
        phases = ", ".join(f"{name} {value:.2f}" for name, value in done)
        return f"start-up {self.total_s:.2f} s: {phases} (hpc_train's own {self.own_s:.2f} s)"


@dataclass(frozen=True, kw_only=True)
class RankCompute(_Record):
    """One rank's own compute time in its latest window (``hpc_train.distributed.stragglers``), as the rank of a
    user's script reports it through its node (``NodeSummary.compute``): rank 0's worker compares the ranks."""

    rank: int
    time: float
    """The end of the window."""
    per_interval_s: float
    """Its forward and backward seconds per forward-backward interval (a micro-batch) in the window."""
    intervals: int
    device: str = ""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "rank": _Key("is not a rank number", _integer, required=True),
        "time": _Key("is not a time stamp (seconds since the epoch)", _number, required=True),
        "per_interval_s": _Key("is not a number of seconds", _number, required=True),
        "intervals": _Key("is not a count", _integer, required=True),
        "device": _Key("is not a device name", _string),
    }


@dataclass(frozen=True, kw_only=True)
class NodeSummary(_Record):
    """One node's ranks as the node last reported them (``status/node_<host>.json``, ``hpc_train.core.nodes``):
    rewritten every 10 s while the node trains, at once when one of its ranks ends."""

    host: str
    time: float
    """When it was written: when the node was last heard."""
    run: str | None = None
    """The run dir that wrote it (``RunDir.clear_statuses`` deletes only its own)."""
    ranks: tuple[RankStatus, ...] = ()
    progress: tuple[Progress, ...] = ()
    """The progress of the node's ranks that keep one (the trainer's rank 0; each rank of a user's script)."""
    startup: tuple[StartupProfile, ...] = ()
    """Where each rank's start-up went (once it reached its first step)."""
    compute: tuple[RankCompute, ...] = ()
    """A user's script: each rank's own compute time in its latest window (stragglers)."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "host": _Key("is not a host name", _string, required=True),
        "time": _Key("is not a time stamp (seconds since the epoch)", _number, required=True),
        "run": _Key("is not a run dir's path", _or_none(_string)),
        "ranks": _records(RankStatus),
        "progress": _records(Progress),
        "startup": _records(StartupProfile),
        "compute": _records(RankCompute),
    }


@dataclass(frozen=True, kw_only=True)
class SlowRank(_Record):
    """A straggler (``hpc_train.distributed.stragglers``): a rank whose own compute time per step has stayed
    ``margin`` times above the median of the other ranks' for ``windows`` windows in a row."""

    rank: int
    host: str = ""
    device: str = ""
    """Its device as the rank table has it (``cuda:1``, ``cpu``)."""
    slowdown: float
    """Its own time per step over the median of the other ranks', in the latest window."""
    per_step_s: float | None = None
    """Its own time per step in the latest window, seconds."""
    since_step: int | None = None
    """The step of the first window of its slow run."""
    since_time: float | None = None
    windows: int | None = None
    """How many windows in a row it has been slow."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "rank": _Key("is not a rank number", _integer, required=True),
        "host": _Key("is not a host name", _string),
        "device": _Key("is not a device name", _string),
        "slowdown": _Key("is not a ratio", _number, required=True),
        "per_step_s": _SECONDS,
        "since_step": _STEP,
        "since_time": _TIME,
        "windows": _Key("is not a count", _or_none(_integer)),
    }

    def describe(self) -> str:
        """``rank 5 (node3, cuda:1) 1.62x the others' median for 3 windows, since step 400``."""
        where = ", ".join(w for w in (self.host, self.device) if w)
        since = f", since step {self.since_step}" if self.since_step is not None else ""
        windows = f" for {self.windows} windows" if self.windows else ""
        return (
            f"rank {self.rank}{f' ({where})' if where else ''} {self.slowdown:.2f}x the others' median{windows}{since}"
        )


@dataclass(frozen=True, kw_only=True)
class StragglerReport(_Record):
    """Rank 0's verdict on the latest window (``status/stragglers.json``): the slowest rank's own compute time per
    step, the median of the other ranks' (what a step would take without the slowest), and the stragglers,
    slowest first. (Verdicts written before hpc_train judged each rank against the others' median have the median
    of every rank's in ``median_s``.)"""

    time: float
    step: int | None = None
    median_s: float = 0.0
    """The median of every rank's own time per step but the slowest's (one rank: its own)."""
    slowest_s: float | None = None
    ranks: tuple[SlowRank, ...] = ()
    ranks_measured: int | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "time": _Key("is not a time stamp (seconds since the epoch)", _number, required=True),
        "step": _STEP,
        "median_s": _Key("is not a number of seconds", _number),
        "slowest_s": _SECONDS,
        "ranks": _records(SlowRank),
        "ranks_measured": _Key("is not a count", _or_none(_integer)),
    }

    @property
    def lost_fraction(self) -> float:
        """The share of its samples per second the job loses to its slowest rank: a step lasts as long as that
        rank's (0 when no rank is slower than the median)."""
        if not self.slowest_s or not self.median_s or self.slowest_s <= self.median_s:
            return 0.0
        return 1.0 - self.median_s / self.slowest_s

    def tracker_figures(self) -> dict[str, float]:
        """What the trackers get of the window: the slowest rank's own time per step over the median's
        (``stragglers/slowest_x_median``), how many stragglers there are, and each straggler's node with its
        slowdown (``stragglers/node/<host>``: a node's line appears in the tracker only while it is slow)."""
        if not self.median_s:
            return {}
        figures = {
            "stragglers/slowest_x_median": round((self.slowest_s or self.median_s) / self.median_s, 4),
            "stragglers/count": float(len(self.ranks)),
        }
        for slow in self.ranks:
            key = f"stragglers/node/{slow.host or f'rank{slow.rank}'}"
            figures[key] = max(figures.get(key, 0.0), slow.slowdown)
        return figures

    def describe(self) -> str:
        """One line per straggler, or '' when there is none."""
        if not self.ranks:
            return ""
        lost = f"; the job loses {100 * self.lost_fraction:.0f}% of its samples/s to the slowest"
        named = first_few([r.describe() for r in self.ranks], sep="; ")  # a slow rack: the first five, counted
        return (
            f"straggler{'s' if len(self.ranks) > 1 else ''}: {named} (the others' median {self.median_s:.4f} s/step)"
            f"{lost}"
        )


_SHA256 = _Key("is not a SHA-256 in hex", lambda v: isinstance(v, str) and len(v) == 64, required=True)


@dataclass(frozen=True, kw_only=True)
class MirroredFile(_Record):
    """One file of a run as its mirror holds it, verified (``hpc_train.mirror``): its path in the run dir, the
    SHA-256 and size the copy read back with, when it landed, and for a checkpoint its step."""

    name: str
    """The path in the run dir: ``checkpoints/step_000000040.pt``, ``model_final.pt``, ``status/attempts.json``."""
    sha256: str
    size: int
    time: float
    step: int | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "name": _Key(
            "is not a relative path in the run dir",
            lambda v: isinstance(v, str) and bool(v) and not v.startswith("/") and ".." not in v.split("/"),
            required=True,
        ),
        "sha256": _SHA256,
        "size": _Key("is not a size in bytes", _integer, required=True),
        "time": _Key("is not a time stamp", _number, required=True),
        "step": _STEP,
    }


@dataclass(frozen=True, kw_only=True)
class MirrorLedger(_Record):
    """The mirror's own ledger (``mirror.json`` at the mirror's root): each file it holds that was verified
    after the copy. Only what it names is resumed from, pulled, or pruned."""

    run: str
    """The run dir it mirrors (as rank 0 resolved it)."""
    files: tuple[MirroredFile, ...] = ()
    time: float | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "run": _Key("is not a path", _string, required=True),
        "files": _records(MirroredFile),
        "time": _TIME,
    }

    def checkpoints(self) -> list[MirroredFile]:
        """The checkpoints it names, oldest step first."""
        found = [f for f in self.files if f.step is not None and f.name.startswith("checkpoints/")]
        return sorted(found, key=lambda f: f.step or 0)

    def named(self, name: str) -> MirroredFile | None:
        return next((f for f in self.files if f.name == name), None)


@dataclass(frozen=True, kw_only=True)
class MirrorStatus(_Record):
    """Rank 0's latest word on the mirror (``status/mirror.json``), for ``jobs status``."""

    store: str
    time: float
    landed: str = ""
    """The newest checkpoint the mirror holds verified ('' when none)."""
    landed_step: int | None = None
    error: str = ""
    """Why the latest copy did not land ('' when it did)."""
    seconds: float | None = None
    """How long the latest copy took, from its start until the mirror's ledger named it."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "store": _Key("is not a string", _string, required=True),
        "time": _Key("is not a time stamp", _number, required=True),
        "landed": _Key("is not a string", _string),
        "landed_step": _STEP,
        "error": _Key("is not a string", _string),
        "seconds": _SECONDS,
    }


@dataclass(frozen=True, kw_only=True)
class MirrorOrigin(_Record):
    """Where ``jobs pull`` brought a run dir from (``status/pulled.json``): the mirror, and the run dir its ledger
    names. The run goes on mirroring there from its new place."""

    store: str
    run: str
    time: float

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "store": _Key("is not a string", _string, required=True),
        "run": _Key("is not a path", _string, required=True),
        "time": _Key("is not a time stamp", _number, required=True),
    }


@dataclass(frozen=True, kw_only=True)
class Interrupted(_Record):
    """A local launcher ended its job on Ctrl-C or SIGTERM (``status/interrupted.json``): what ``jobs status`` says
    of a run whose ranks were stopped before any of them wrote a status, or while they were all still starting."""

    job_id: str
    """The local job's id (submitit's controller)."""
    time: float
    run: str
    """The run dir it was written for (``RunDir.clear_statuses`` deletes only its own)."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "job_id": _Key("is not a job id", _string, required=True),
        "time": _Key("is not a time stamp", _number, required=True),
        "run": _Key("is not a run dir's path", _string, required=True),
    }


def _checkpoint_file(value: Any) -> bool:
    """A checkpoint's name in ``checkpoints/``: ``step_<n>.pt`` and no path (a ledger never names a file elsewhere)."""
    return isinstance(value, str) and "/" not in value and value.startswith("step_")


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord(_Record):
    """One checkpoint this run wrote, as the checkpoint ledger holds it (``train.checkpoint``)."""

    file: str
    """The file's name in ``checkpoints/``."""
    step: int
    sha256: str
    size: int
    """Bytes."""
    time: float
    """When it was published, in seconds since the epoch."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "file": _Key("is not a checkpoint's file name (step_<n>.pt)", _checkpoint_file, required=True),
        "step": _Key("is not a step number", _integer, required=True),
        "sha256": _Key("is not a digest", _string, required=True),
        "size": _Key("is not a number of bytes", _integer, required=True),
        "time": _Key("is not a time stamp", _number, required=True),
    }

    @classmethod
    def parse(cls, raw: Any) -> CheckpointRecord | None:
        """The record in a ledger entry; None for an entry that is damaged."""
        return cls.salvage(raw)[0]


def _entries(record: type[_Record]) -> _Key:
    """A list of records where each damaged entry is dropped on its own (a ledger keeps what is whole), unlike
    ``_records``, where one entry that is no record makes the whole list wrong."""

    return replace(_records(record), says="is not a list", valid=lambda v: isinstance(v, list))


@dataclass(frozen=True, kw_only=True)
class CheckpointLedger(_Record):
    """The checkpoints a run wrote (``status/checkpoints.json``): each with its digest, the temp files being
    written (a writer killed halfway leaves its name), a copy of the tracker runs, and whose run dir it is."""

    checkpoints: tuple[CheckpointRecord, ...] = ()
    writing: tuple[str, ...] = ()
    """Temp files being written, by name in ``checkpoints/``."""
    trackers: tuple[TrackerRun, ...] = ()
    """A copy of ``status/trackers.json`` as of the latest checkpoint: the runs' ids outlive a lost trackers.json."""
    run: str | None = None
    """The run dir it belongs to, resolved."""
    inode: tuple[int, ...] | None = None
    """The run dir's (device, inode): a move on one file system keeps it."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "checkpoints": _entries(CheckpointRecord),
        "writing": _Key(
            "is not a list of file names",
            lambda v: isinstance(v, list),
            lambda v: tuple(w for w in v if isinstance(w, str) and "/" not in w),
        ),
        "trackers": _entries(TrackerRun),
        "run": _Key("is not a run dir's path", _string),
        "inode": _Key("is not a (device, inode) pair", lambda v: isinstance(v, list) and all(map(_integer, v)), tuple),
    }

    def belongs_to(self, run: str, inode: tuple[int, ...] | None) -> bool:
        """Whether it is the ledger of the run dir at ``run`` (or of the one with ``inode``, moved since); one that
        names no run dir (written before it did) is."""
        return self.run is None or self.run == run or self.inode == inode


@dataclass(frozen=True, kw_only=True)
class RankTableEntry(_Record):
    """One rank's row of ``rank_table.json`` (``distributed.table.RankRow``, with the attempt that gathered it):
    what the rank resolved about itself."""

    host: str
    rank: int
    local_rank: int
    node: int
    device: str
    backend: str
    master: str
    """MASTER_ADDR:MASTER_PORT."""
    source: str
    """Where its rank came from (torchrun, Slurm, submitit, ...)."""
    pid: int
    cuda_visible_devices: str = ""
    attempt: int | None = None
    asked: str | None = None
    """For a job that asked for a node range: what it got (``job 12 asked for 2-8 nodes, got 4``)."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "host": _Key("is not a host name", _string, required=True),
        "rank": _Key("is not a rank number", lambda v: _integer(v) and v >= 0, required=True),
        "local_rank": _Key("is not a rank number", _integer, required=True),
        "node": _Key("is not a node number", _integer, required=True),
        "device": _Key("is not a device", _string, required=True),
        "backend": _Key("is not a backend", _string, required=True),
        "master": _Key("is not an address", _string, required=True),
        "source": _Key("is not a source", _string, required=True),
        "pid": _Key("is not a process id", _integer, required=True),
        "cuda_visible_devices": _Key("is not a string", _string),
        "attempt": _Key("is not an attempt number", _integer),
        "asked": _Key("is not a string", _string),
    }


@dataclass(frozen=True, kw_only=True)
class ScalingPoint(_Record):
    """One run of a scaling study (``python -m hpc_train.scaling``), with its throughput and how it compares with
    the smallest world size of its mode and data size. Read back by ``cluster.slurm.scaling``, which needs only
    the mode, the world size and the throughput."""

    mode: str = "strong"
    """``strong`` (the global batch fixed) or ``weak`` (the batch per rank fixed)."""
    world_size: int
    samples_per_s: float
    """The median of the run's logged samples/s after its first row."""
    nodes: int | None = None
    tasks_per_node: int | None = None
    batch_size: int | None = None
    """trainer.batch_size of the run (per rank)."""
    data_size: int | None = None
    """data.num_samples of the run (None: the config's)."""
    speedup: float | None = None
    efficiency: float | None = None
    """The speed-up over the world size's multiple of the smallest one."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "mode": _Key("is not a mode (strong, weak)", lambda v: v in ("strong", "weak")),
        "world_size": _Key("is not a number of ranks", lambda v: _integer(v) and v > 0, required=True),
        "nodes": _Key("is not a number of nodes", _integer),
        "tasks_per_node": _Key("is not a number of tasks", _integer),
        "batch_size": _Key("is not a batch size", _integer),
        "data_size": _Key("is not a number of samples", _or_none(_integer)),
        "samples_per_s": _Key("is not a number of samples per second", _number, float, required=True),
        "speedup": _Key("is not a number", _number),
        "efficiency": _Key("is not a number", _number),
    }
    NULLS = frozenset({"data_size"})


@dataclass(frozen=True, kw_only=True)
class ScalingStudy(_Record):
    """A scaling study's table (``scaling.json``): its points, the efficiency threshold and the world size it
    recommends for each mode."""

    points: tuple[ScalingPoint, ...]
    threshold: float | None = None
    recommended: Mapping[str, int] | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "points": replace(_records(ScalingPoint), required=True),
        "threshold": _Key("is not a number", _number),
        "recommended": _Key(
            "is not a mode -> ranks mapping",
            lambda v: isinstance(v, dict) and all(isinstance(k, str) and _integer(n) for k, n in v.items()),
            dict,
        ),
    }


@dataclass(frozen=True, kw_only=True)
class BatchExit(_Record):
    """How the job script's supervisor ended (``status/batch_exit.json``): written by the sbatch script's teardown
    (``launch.sbatch``, with bash's printf), or for each member of a pack by the pack's supervisor."""

    exit_code: int
    job_id: str | None = None
    end: float | None = None
    """When it ended, in seconds since the epoch."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "job_id": _Key("is not a job id", _string),
        "exit_code": _Key("is not an exit status", _integer, required=True),
        "end": _Key("is not a time stamp", _number),
    }


@dataclass(frozen=True, kw_only=True)
class PackPlace(_Record):
    """A run's place in a pack (``cluster.pack``): the runs that share its job, itself included, in sweep order."""

    index: int
    members: tuple[str, ...]

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "index": _Key("is not a member number", _integer, required=True),
        "members": _Key("is not a list of run dirs", _strings, tuple, required=True),
    }


@dataclass(frozen=True, kw_only=True)
class JobRecord(_Record):
    """What the scheduler was asked for (``job.json``, Slurm runs only), written when Slurm accepted the job."""

    job_id: str
    """The job's id; an array element's is ``<array>_<index>`` (the members of a pack share their job's)."""
    scheduler: str = "slurm"
    submit: str = ""
    """cluster.slurm.submit: sbatch or submitit."""
    array_job_id: str | None = None
    array_index: int | None = None
    script: str = ""
    """The job script (an array's, in the sweep's log folder)."""
    slurm_output: str = ""
    """Slurm's output file of the batch step."""
    world_size: int | None = None
    nodes: str = ""
    """What the job asked Slurm for: a count, or a range ("2-4")."""
    overrides: tuple[str, ...] = ()
    submitted: float | None = None
    pack: PackPlace | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "job_id": _Key("is not a job id", _string, str, required=True),
        "scheduler": _Key("is not a string", _string),
        "submit": _Key("is not a string", _string),
        "array_job_id": _Key("is not a job id", _or_none(_string)),
        "array_index": _Key("is not an array index", _or_none(_integer)),
        "script": _Key("is not a path", _string),
        "slurm_output": _Key("is not a path", _string),
        "world_size": _Key("is not a rank count", _or_none(_integer)),
        "nodes": _Key("is not a node count or range", _string),
        "overrides": _Key("is not a list of overrides", _strings, tuple),
        "submitted": _TIME,
        "pack": _nested(PackPlace),
    }
    NULLS = frozenset({"array_job_id", "array_index"})


_PID_START = _Key("is not an integer (clock ticks since boot)", _or_none(_integer))
_JOB_ID = _Key("is not a job id", lambda v: _string(v) or _integer(v), str)


@dataclass(frozen=True, kw_only=True)
class LeaseWatcher(_Process):
    """The process that stops a local launcher's ranks when the launcher is killed (``LeaseRecord.watcher``)."""

    pid: int
    pid_start: int | None = None

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "pid": _Key("is not a process id", _integer, required=True),
        "pid_start": _PID_START,
    }
    NULLS = frozenset({"pid_start"})


@dataclass(frozen=True, kw_only=True)
class LeaseRecord(_Process):
    """The lease of the launch or Slurm job that owns a run dir (``owner.json``, ``hpc_train.core.owner``).

    No key is required: a lease is judged on what it holds, and a value of the wrong type counts as absent
    (``salvage``), as launchers have always judged it."""

    token: str | None = None
    """Names the claim: a launcher rewrites or removes the lease only while it still holds its token."""
    kind: str | None = None
    """``process``: a launcher owns the run dir; ``slurm``: the Slurm job ``job_id`` does."""
    launcher: str | None = None
    """The launcher that claimed it: ``local``, ``debug``, ``slurm``, ``slurm submit=here``."""
    run_dir: str | None = None
    host: str | None = None
    user: str | None = None
    pid: int | None = None
    """The launcher's process on ``host``."""
    pid_start: int | None = None
    since: float | None = None
    heartbeat: float | None = None
    """When the launcher last rewrote the lease (every ``owner.HEARTBEAT_S``)."""
    allocation: str | None = None
    """cluster.slurm.submit=here: the Slurm allocation the launcher runs in..."""
    requeue: int | None = None
    """... and Slurm's restart count of it when the lease was taken (``restart`` in leases written before)."""
    watcher: LeaseWatcher | None = None
    job_id: str | None = None
    """The Slurm job it was handed to (``kind`` slurm)."""
    handed: float | None = None
    """When it was handed to that job."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys the record does not name (facts a launcher recorded): written as they are."""

    KEYS: ClassVar[Mapping[str, _Key]] = {
        "token": _Key("is not a token", _string),
        "kind": _Key("is not a string", _string),
        "launcher": _Key("is not a string", _string),
        "run_dir": _Key("is not a run dir's path", _string),
        "host": _Key("is not a host name", _string),
        "user": _Key("is not a user name", _string),
        "pid": _Key("is not a process id", _integer),
        "pid_start": _PID_START,
        "since": _TIME,
        "heartbeat": _TIME,
        "allocation": _JOB_ID,
        # isinstance(v, int), a JSON true included: launchers have always compared it so.
        "requeue": _Key("is not a restart count", lambda v: isinstance(v, int)),
        "watcher": _nested(LeaseWatcher),
        "job_id": _JOB_ID,
        "handed": _TIME,
    }
    NULLS = frozenset({"pid_start"})
    RENAMED: ClassVar[Mapping[str, str]] = {"restart": "requeue"}

    @classmethod
    def _make(cls, values: dict[str, Any], unknown: dict[str, Any]) -> Self:
        return cls(**values, extra=unknown)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), **self.extra}
