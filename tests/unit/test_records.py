"""The typed run-dir records (hpc_train.core.records): the JSON they read and write is the one run dirs hold."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hpc_train.core import records
from hpc_train.core.records import (
    Allocation,
    AttemptOutcome,
    AttemptRecord,
    BadNode,
    Failure,
    Progress,
    RankState,
    RankStatus,
    RecordError,
    RequeueEntry,
)
from hpc_train.core.rundir import RunDir

RECORDS = [
    kind
    for kind in vars(records).values()
    if isinstance(kind, type) and issubclass(kind, records._Record) and dataclasses.is_dataclass(kind)
]
"""Every record of core/records.py (the lease, the batch exit, the checkpoint ledger, ... as well)."""

# As the supervisor wrote them before the records were typed (status/attempts.json, allocations.json, ...).
FAILED_ATTEMPT = {
    "attempt": 0,
    "job_id": "1208",
    "requeue": 0,
    "nodes": ["node1", "node2"],
    "start": 1700000001.5,
    "end": 1700000047.25,
    "outcome": "failed",
    "script": False,
    "exit_code": 137,
    "progress": {
        "first_step": 1,
        "first_time": 1700000011.0,
        "step": 35,
        "time": 1700000045.0,
        "checkpoint_step": 30,
        "checkpoint_time": 1700000040.0,
        "run": "/runs/a",
    },
    "failure": {
        "kind": "killed",
        "rank": 2,
        "host": "node2",
        "error": "the process ended without reporting an error: Killed",
        "traceback": "",
        "step": 35,
        "suspects": ["node2"],
        "retryable": True,
        "describe": "killed (retryable): rank 2 on node2 at step 35: the process ended without reporting an error: Killed",
    },
}
RUNNING_ATTEMPT = {
    "attempt": 1,
    "job_id": "1208",
    "requeue": 0,
    "nodes": ["node1", "node3"],
    "start": 1700000048.0,
    "end": None,
    "outcome": "running",
    "script": True,
}
GAVE_UP = FAILED_ATTEMPT | {"outcome": "gave_up", "message": "not restarted: 3 failures in this job"}
ABANDONED = RUNNING_ATTEMPT | {"end": 1700000060.0, "outcome": "lost", "progress": {}, "message": "its batch step"}
ALLOCATION = {"job_id": "1208_3", "requeue": 1, "nodes": ["node1", "node2", "node3"], "start": 5.0, "end": None}
REQUEUE = {"attempt": 2, "resumed_step": None, "stopped_step": None, "signal": 12, "time": 1700000000.0}
BAD_NODE = {"host": "node2", "why": "killed (retryable): rank 2 on node2", "attempt": 0}
STATUS = {
    "rank": 1,
    "state": "stopped",
    "host": "node2",
    "pid": 4242,
    "pid_start": 123456,
    "time": 1700000050.0,
    "run": "/runs/a",
    "attempt": 3,
    "step": 40,
    "signal": 12,
    "requeued": "1208",
    "cuda_max_mem_mb": 812.5,
}


@pytest.mark.parametrize(
    ("kind", "record"),
    [
        (AttemptRecord, FAILED_ATTEMPT),
        (AttemptRecord, RUNNING_ATTEMPT),
        (AttemptRecord, GAVE_UP),
        (AttemptRecord, ABANDONED),
        (Allocation, ALLOCATION),
        (RequeueEntry, REQUEUE),
        (BadNode, BAD_NODE),
        (RankStatus, STATUS),
        (Progress, FAILED_ATTEMPT["progress"]),
    ],
)
def test_what_the_run_dirs_hold_reads_back_to_the_same_json(kind: Any, record: dict[str, Any]) -> None:
    typed = kind.from_json(json.loads(json.dumps(record)))
    assert typed.to_json() == record
    assert json.dumps(typed.to_json(), sort_keys=True) == json.dumps(record, sort_keys=True)  # the same bytes


@pytest.mark.parametrize(
    ("kind", "old", "now"),
    [
        # Before one name: a supervised rank wrote its attempt twice, a local rank only as "restart".
        (RankStatus, STATUS | {"restart": 3}, STATUS),
        (RankStatus, {**{k: v for k, v in STATUS.items() if k != "attempt"}, "restart": 3}, STATUS),
        (RequeueEntry, {**{k: v for k, v in REQUEUE.items() if k != "attempt"}, "restart": 2}, REQUEUE),
        (
            records.LeaseRecord,
            {"token": "t", "allocation": "77", "restart": 1},
            {"token": "t", "pid_start": None, "allocation": "77", "requeue": 1},
        ),
    ],
)
def test_records_written_before_the_attempt_had_one_name_read_by_todays_names(
    kind: Any, old: dict[str, Any], now: dict[str, Any]
) -> None:
    """``attempt`` is hpc_train's attempt number in every record, ``requeue`` Slurm's restart count."""
    typed = kind.from_json(old)
    assert typed.to_json() == now
    assert kind.from_json(now) == typed


def test_fields_are_typed_and_outcomes_are_todays_strings() -> None:
    attempt = AttemptRecord.from_json(FAILED_ATTEMPT)
    assert attempt.outcome is AttemptOutcome.FAILED and attempt.outcome == "failed"
    assert attempt.failure is not None and attempt.failure.suspects == ("node2",) and attempt.failure.retryable
    assert attempt.progress is not None and attempt.progress.checkpoint_step == 30
    assert attempt.allocation == ("1208", 0)
    assert [o.value for o in AttemptOutcome] == [
        "running",
        "completed",
        "stopped",
        "failed",
        "fatal",
        "gave_up",
        "lost",
    ]
    status = RankStatus.from_json(STATUS)
    assert status.state is RankState.STOPPED and status.extra == {"cuda_max_mem_mb": 812.5}


def test_older_records_without_the_optional_keys_still_read() -> None:
    attempt = AttemptRecord.from_json({"attempt": 0, "outcome": "completed", "start": 1.0, "end": 2.0})
    assert (attempt.job_id, attempt.requeue, attempt.nodes, attempt.failure, attempt.progress) == (
        "",
        0,
        (),
        None,
        None,
    )
    assert Allocation.from_json({"job_id": "9", "start": 100.0, "end": None}).allocation == ("9", 0)
    assert RequeueEntry.from_json({"restart": 0, "resumed_step": 0, "stopped_step": 40, "signal": 12}).time is None
    assert Failure.from_json({"kind": "killed"}).describe() == "killed (retryable): the step: "
    assert RankStatus.from_json({"rank": 0, "state": "running"}).pid_start is None
    assert Progress.from_json({}) == Progress() and Progress().to_json() == {}


@pytest.mark.parametrize(
    ("kind", "record", "says"),
    [
        (AttemptRecord, {"attempt": "0", "outcome": "failed"}, "attempt='0' is not an attempt number"),
        (AttemptRecord, {"attempt": 0, "outcome": "exploded"}, "outcome='exploded' is not an outcome"),
        (AttemptRecord, {"attempt": 0}, "outcome is missing"),
        (AttemptRecord, {"attempt": 0, "outcome": "failed", "failure": "boom"}, "failure='boom' is not a JSON object"),
        (
            AttemptRecord,
            {"attempt": 0, "outcome": "failed", "failure": {"kind": 3}},
            "failure.kind=3 is none of killed, node_lost",
        ),
        (AttemptRecord, {"attempt": 0, "outcome": "failed", "start": True}, "start=True is not a time stamp"),
        (Allocation, {"start": "soon"}, "start='soon' is not a time stamp"),
        (RequeueEntry, {"restart": 0, "signal": 12, "stopped_step": 4.5}, "stopped_step=4.5 is not a step number"),
        (RankStatus, {"rank": 0, "state": 5}, "state=5 is none of starting, running"),
        (RankStatus, {"rank": 0, "state": "running", "pid": "x"}, "pid='x' is not a process id"),
        (Progress, [3], "holds a JSON list, not an object"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_with_what_it_should_be(kind: Any, record: Any, says: str) -> None:
    with pytest.raises(RecordError, match=f"damaged {kind.__name__} record: .*{says}"):
        kind.from_json(record)


def test_salvage_keeps_what_is_whole() -> None:
    record, problems = AttemptRecord.salvage({"attempt": 0, "outcome": "failed", "progress": [3], "end": 5.0})
    assert record == AttemptRecord(attempt=0, outcome=AttemptOutcome.FAILED, end=5.0)
    assert problems == ["progress=[3] is not a JSON object"]
    assert AttemptRecord.salvage({"outcome": 3}) == (
        None,
        ["outcome=3 is not an outcome (running, completed, stopped, failed, ...)", "attempt is missing"],
    )


def test_every_field_without_a_default_is_a_required_key() -> None:
    assert len(RECORDS) >= 25 and records.CheckpointLedger in RECORDS and records.BatchExit in RECORDS
    for kind in RECORDS:
        needed = {
            f.name
            for f in dataclasses.fields(kind)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert needed == {key for key, spec in kind.KEYS.items() if spec.required}, kind
        assert set(kind.KEYS) <= {f.name for f in dataclasses.fields(kind)}, kind


def test_records_are_built_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        Failure("killed")  # type: ignore[misc]


def test_run_dir_writes_and_reads_them(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.write_attempts([AttemptRecord.from_json(FAILED_ATTEMPT), AttemptRecord.from_json(RUNNING_ATTEMPT)])
    assert rd.read_attempts() == [FAILED_ATTEMPT, RUNNING_ATTEMPT]
    assert [a.attempt for a in rd.attempt_records()] == [0, 1]
    rd.write_allocations([Allocation.from_json(ALLOCATION)])
    assert rd.read_allocations() == [ALLOCATION] and rd.allocation_records()[0].end is None
    rd.append_restart(RequeueEntry.from_json(REQUEUE))
    assert rd.read_restarts() == [REQUEUE] and rd.requeue_records()[0].signal == 12
    rd.add_bad_node("node2", BAD_NODE["why"], 0)
    rd.add_bad_node("node2", "again", 1)
    assert rd.read_bad_nodes() == [BAD_NODE] and rd.bad_node_records()[0].host == "node2"
    rd.write_progress(0, {"first_step": 1, "first_time": 5.0, "step": 3, "time": 7.0})
    assert rd.read_progress(0) == {"first_step": 1, "first_time": 5.0, "step": 3, "time": 7.0, "run": str(tmp_path)}
    assert rd.progress_record(0).step == 3 and rd.progress_record(1) == Progress()
    with pytest.raises(RecordError, match="step='3' is not a step number"):
        rd.write_progress(0, {"step": "3"})
    rd.write_status(0, "running", step=5, attempt=0, cuda_max_mem_mb=1.5)
    raw = rd.read_statuses()[0]
    assert {k: raw[k] for k in ("rank", "state", "step", "attempt", "cuda_max_mem_mb")} == {
        "rank": 0,
        "state": "running",
        "step": 5,
        "attempt": 0,
        "cuda_max_mem_mb": 1.5,
    }
    assert rd.rank_statuses()[0] == RankStatus.from_json(raw)
    rd.status_path(1).write_text('{"rank": 1, "state": "bogus"}')
    assert list(rd.rank_statuses()) == [0]  # a status without a state it knows is left out
    (rd.attempts).write_text('[{"attempt": 0, "outc')
    assert rd.attempt_records() == [] and "not valid JSON" in rd.checked_attempts()[1][0]
