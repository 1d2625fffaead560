"""``jobs status``: one typed view per run (``RunView``), built once and rendered as JSON and as text; both
renderings say the same things about the same run. The run dirs are written from records, as a supervised
Slurm job leaves them (tests/integration runs ``jobs status`` on the testbed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_train.core.records import (
    Allocation,
    AttemptOutcome,
    AttemptRecord,
    Failure,
    FailureKind,
    JobRecord,
    MirrorStatus,
    Progress,
    SlowRank,
    StragglerReport,
)
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config
from hpc_train.tools.jobs import cmd_status, status_json, status_text, status_views

from .test_config import composed

T = 1_000_000.0


def supervised_run(path: Path) -> RunDir:
    """A 2-rank job: attempt 0 failed at step 45 with a traceback, attempt 1 runs; a straggler named, a mirror
    that holds step 40, a rank status that is damaged."""
    rd = RunDir(path)
    write_config(composed("cluster.nodes=1", "cluster.tasks_per_node=2"), rd, overrides=[])
    rd.status_dir.mkdir(exist_ok=True)
    rd.write_job_record(JobRecord(job_id="7", submitted=T))
    rd.write_allocations([Allocation(job_id="7", requeue=0, start=T + 10, end=T + 200)])
    failure = Failure(kind=FailureKind.KILLED, step=45, rank=1, host="n2", traceback="Traceback:\n  File x\nKilled")
    rd.write_attempts([
        AttemptRecord(attempt=0, outcome=AttemptOutcome.FAILED, job_id="7", requeue=0, start=T + 11, end=T + 130,
                      progress=Progress(first_step=1, first_time=T + 21, step=45, time=T + 120, checkpoint_step=40,
                                        checkpoint_time=T + 115), failure=failure),
        AttemptRecord(attempt=1, outcome=AttemptOutcome.FAILED, job_id="7", requeue=0, start=T + 135, end=T + 190,
                      progress=Progress(first_step=41, first_time=T + 145, step=60, time=T + 185, checkpoint_step=60,
                                        checkpoint_time=T + 185), failure=failure),
    ])  # fmt: skip
    slow = (SlowRank(rank=1, host="n2", slowdown=1.7, since_time=T + 150),)
    rd.record_stragglers(StragglerReport(time=T + 160, step=50, median_s=0.1, slowest_s=0.17, ranks=slow))
    rd.write_mirror_status(
        MirrorStatus(store="s3://b/run", time=T + 170, landed="step_40", landed_step=40, seconds=2.5)
    )
    rd.status_path(1).write_text("{not json")
    return rd


def status(capsys: pytest.CaptureFixture[str], runs: list[RunDir], as_json: bool) -> tuple[int, str, str]:
    code = cmd_status(runs, as_json)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No squeue or sacct on PATH: the state comes from the run dir alone (as where the job's Slurm is gone)."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))


def test_json_and_text_say_the_same_about_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_slurm: None
) -> None:
    rd = supervised_run(tmp_path / "run")
    broken = RunDir(tmp_path / "broken")
    broken.path.mkdir()
    broken.config.write_text("not: [valid")
    code, text, err = status(capsys, [rd, broken], as_json=False)
    assert code == 2 and "cannot be read" in err and str(broken.path) in err
    code, out, _ = status(capsys, [rd, broken], as_json=True)
    (record,) = json.loads(out)  # the unreadable run is on stderr only, in both
    assert code == 2 and record["run_dir"] == str(rd.path) and record["job_id"] == "7"
    assert record["attempt"] == 1 and record["failure"]["kind"] == "killed" and record["failure"]["rank"] == 1
    assert record["stragglers"]["ranks"][0]["rank"] == 1 and record["mirror"]["landed_step"] == 40
    assert record["goodput"]["attempts"] == 2 and record["damaged"]
    row = next(line for line in text.splitlines() if line.startswith(str(rd.path)))
    assert " 7 " in row and f" {record['state']} " in row and f" {record['goodput']['ettr']:.2f} " in row
    assert "failures (class, rank, host, traceback tail):" in text and "attempt 1: " in text and "Killed" in text
    assert "stragglers (" in text and "rank 1 (n2) 1.70x" in text
    assert "mirror (trainer.mirror, status/mirror.json):" in text and "s3://b/run holds step 40 verified" in text
    assert "where the time went:" in text
    assert "damaged records (left out of the state above):" in text and str(rd.status_path(1)) in text


def test_a_view_is_read_once_and_rendered_twice(tmp_path: Path, no_slurm: None) -> None:
    """Both renderings come from the same views: the run dir changing after they were built changes neither."""
    rd = supervised_run(tmp_path / "run")
    (view,), unreadable = status_views([rd], now=T + 200)
    assert not unreadable and view.attempt == 1 and view.pack is None and view.node_summary == "status/node_<host>.json"
    assert view.stragglers == (f"{rd.path}: {view.straggler_report.describe()} (step 50, 40 s ago)",)  # type: ignore[union-attr]
    assert view.mirror_line == f"{rd.path}: s3://b/run holds step 40 verified (30 s ago); the copy took 2.5 s"
    rd.write_mirror_status(MirrorStatus(store="s3://b/run", time=T + 199, error="no route"))
    text, (record,) = status_text([view], {}), json.loads(status_json([view], {}))
    assert "holds step 40 verified (30 s ago)" in text and record["mirror"]["landed_step"] == 40
    assert record["goodput"]["ettr"] == view.goodput.ettr and f"{view.goodput.ettr:.2f}" in text  # type: ignore[union-attr]
