"""One retry policy (``runtime.retry``) for requeues and in-allocation restarts, and the job identity
(``core.identity``) every process builds once from its environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.identity import ATTEMPT_VARIABLE, JobIdentity
from hpc_train.core.records import AttemptRecord, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.runtime.retry import RetryBudget, attempt_progressed, progressed, requeue_progressed


def test_job_identity_reads_slurm_and_the_supervisor_once() -> None:
    array = {"SLURM_JOB_ID": "108", "SLURM_ARRAY_JOB_ID": "107", "SLURM_ARRAY_TASK_ID": "1", "SLURM_RESTART_COUNT": "2"}
    job = JobIdentity.from_environ(array, launched=5)
    assert job.slurm_job == "107_1" and job.job_id == "108" and job.allocation == ("107_1", 2)
    assert job.attempt == 2 and not job.supervised  # Slurm's restart count beats the launcher's number
    step = job.for_attempt(4)  # what the supervisor hands its training step
    again = JobIdentity.from_environ({**array, **step.environ()})
    assert again.attempt == 4 and again.supervised and again.requeues == 2
    local = JobIdentity.from_environ({}, launched=3)
    assert (local.slurm_job, local.requeues, local.attempt, local.supervised) == (None, 0, 3, False)
    assert JobIdentity.from_environ({ATTEMPT_VARIABLE: "", "SLURM_RESTART_COUNT": "x"}, launched=1).attempt == 1


def test_run_dir_does_not_read_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt a status carries is the one its writer passes; a variable left in the environment does not
    leak into it."""
    monkeypatch.setenv(ATTEMPT_VARIABLE, "7")
    rd = RunDir(tmp_path)
    rd.status_dir.mkdir()
    rd.write_status(0, "running", step=3)
    rd.write_status(1, "running", attempt=2, step=3)
    rd.write_failure(2, "boom", attempt=2)
    statuses = rd.rank_statuses()
    assert statuses[0].attempt is None and statuses[1].attempt == 2 and statuses[2].attempt == 2


def test_progress_means_the_same_for_a_stop_and_a_failure() -> None:
    """Resumed from 30, kept 40: progress whether the attempt stopped (and saved 40) or failed after saving 40."""
    stopped = RequeueEntry(attempt=0, resumed_step=30, stopped_step=40, signal=12)
    failed = AttemptRecord.from_json(
        {"attempt": 0, "outcome": "failed", "progress": {"first_step": 31, "step": 45, "checkpoint_step": 40}}
    )
    assert requeue_progressed(stopped) is attempt_progressed(failed) is True
    stalled = RequeueEntry(attempt=0, resumed_step=30, stopped_step=30, signal=12)
    lost = AttemptRecord.from_json(
        {"attempt": 0, "outcome": "failed", "progress": {"first_step": 31, "step": 35, "checkpoint_step": 30}}
    )
    assert requeue_progressed(stalled) is attempt_progressed(lost) is False
    # Not known: a user's script that reports no steps, stopped or failed alike.
    unknown = AttemptRecord.from_json({"attempt": 0, "outcome": "failed", "script": True})
    assert progressed(None, None) is requeue_progressed(RequeueEntry(attempt=0, signal=12)) is None
    assert attempt_progressed(unknown) is None
    # The built-in trainer records its first step when it makes it: none recorded, none made.
    assert attempt_progressed(AttemptRecord.from_json({"attempt": 0, "outcome": "failed"})) is False


@pytest.mark.parametrize("kind", ["requeues", "restarts"])
def test_one_budget_for_requeues_and_restarts(kind: str) -> None:
    cluster = ClusterConfig(
        launcher="slurm", max_restarts=3, max_stalled_restarts=1, max_failures=3, max_stalled_failures=1
    )
    budget = getattr(RetryBudget, kind)(cluster)
    assert budget == RetryBudget(limit=3, stall_limit=1)
    assert budget.spent(2, [True, True, True]) is None
    limit = budget.spent(3, [True])
    assert limit is not None and not limit.stalled and limit.count == 3
    assert budget.spent(1, [True, False]) is None  # one attempt without progress is tolerated
    stall = budget.spent(2, [True, False, False])
    assert stall is not None and stall.stalled and stall.count == 2
    assert budget.spent(2, [False, None, False]) is None  # not known counts as progress
