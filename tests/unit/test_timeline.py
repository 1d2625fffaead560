"""The run's timeline from its records: bars that add up to the goodput ledger, queue waits, marks, the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Failure, JobRecord, Progress, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.tools.plot import main as plot_main
from hpc_train.tools.timeline import plot_timeline, summary, timeline

T = 1_000_000.0


def progress(first: int, first_time: float, step: int, at: float, ckpt: int, ckpt_time: float) -> Progress:
    return Progress(
        first_step=first, first_time=T + first_time, step=step, time=T + at, checkpoint_step=ckpt,
        checkpoint_time=T + ckpt_time,
    )  # fmt: skip


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    """Submitted at 0; allocation 1 from 10 s: attempt 0 stopped by a signal at step 20 (its checkpoint durable
    at 50 s); requeued, allocation 2 from 80 s: attempt 1 fails at step 45 (checkpoint 40), attempt 2 completes."""
    rd = RunDir(tmp_path)
    rd.status_dir.mkdir()
    rd.write_job_record(JobRecord(job_id="7", submitted=T))
    rd.write_allocations([
        Allocation(job_id="7", requeue=0, start=T + 10, end=T + 60),
        Allocation(job_id="7", requeue=1, start=T + 80, end=T + 200),
    ])  # fmt: skip
    rd.write_attempts([
        AttemptRecord(attempt=0, outcome=AttemptOutcome.STOPPED, job_id="7", requeue=0, start=T + 11, end=T + 55,
                      progress=progress(1, 21, 20, 50, 20, 50)),
        AttemptRecord(attempt=1, outcome=AttemptOutcome.FAILED, job_id="7", requeue=1, start=T + 81, end=T + 130,
                      progress=progress(21, 91, 45, 120, 40, 115), failure=Failure(kind="killed", step=45)),
        AttemptRecord(attempt=2, outcome=AttemptOutcome.COMPLETED, job_id="7", requeue=1, start=T + 135, end=T + 195,
                      progress=progress(41, 145, 60, 185, 60, 185)),
    ])  # fmt: skip
    rd.append_restart(
        RequeueEntry(attempt=0, resumed_step=0, stopped_step=20, signal=12, time=T + 58, stop_saved_s=0.5)
    )
    return rd


def test_the_bars_split_the_allocated_time_as_the_goodput_ledger_does(run: RunDir) -> None:
    line = timeline(run)
    assert line.rows == ["job 7", "job 7 (requeue 1)"]
    totals, gp = line.totals(), line.goodput
    assert gp is not None
    for kind, seconds in (("startup", gp.startup_s), ("productive", gp.productive_s), ("redone", gp.redone_s)):
        assert totals[kind] == pytest.approx(seconds)
    # In the queue: from the submission to the first allocation, and from its end to the requeued one's start.
    assert totals["queue"] == pytest.approx(10 + 20)
    # Outside every attempt but inside an allocation: the supervisor's start and end, the restart gap.
    allocated = totals["startup"] + totals["productive"] + totals["redone"] + totals["gap"]
    assert allocated == pytest.approx(gp.wall_s)
    assert line.origin == T


def test_marks_show_the_stop_the_failure_and_the_checkpoints(run: RunDir) -> None:
    marks = {(m.kind, m.row, round(m.time - T, 3), m.text) for m in timeline(run).marks}
    assert ("stop", 0, 49.5, "signal 12") in marks  # the checkpoint of step 20 was durable 0.5 s after it
    assert ("failure", 1, 130.0, "killed") in marks
    assert {m for m in marks if m[0] == "checkpoint"} == {
        ("checkpoint", 0, 50.0, "step 20"),
        ("checkpoint", 1, 115.0, "step 40"),
        ("checkpoint", 1, 185.0, "step 60"),
    }


def test_a_straggler_is_a_band_from_its_first_slow_window_to_its_last(run: RunDir) -> None:
    from hpc_train.core.records import SlowRank, StragglerReport

    def window(at: float, *slow: int) -> StragglerReport:
        ranks = tuple(SlowRank(rank=r, host="n2", slowdown=1.6, since_time=T + 90) for r in slow)
        return StragglerReport(time=T + at, median_s=0.1, slowest_s=0.16, ranks=ranks)

    for at, slow in [(85, ()), (95, (3,)), (105, (3,)), (110, ())]:
        run.record_stragglers(window(at, *slow))
    (span,) = timeline(run).slow
    assert (span.row, span.start - T, span.end - T, span.text) == (1, 90, 105, "rank 3 (n2) 1.6x")


def test_the_png_and_the_status_line(run: RunDir, capsys: pytest.CaptureFixture[str]) -> None:
    from hpc_train.core.records import SlowRank, StragglerReport

    slow = (SlowRank(rank=1, slowdown=2.0, since_time=T + 100),)
    run.record_stragglers(StragglerReport(time=T + 150, median_s=0.1, slowest_s=0.2, ranks=slow))
    assert plot_main([str(run.path), "--timeline"]) == 0
    png = run.path / "plots" / "timeline.png"
    assert capsys.readouterr().out.strip() == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    line = summary(run)
    assert line.startswith(f"{run.path}: 2 allocation(s), 3 attempt(s): waiting in the queue 30s, start-up ")
    assert f"(draw it: python -m hpc_train.plot {run.path} --timeline)" in line


def test_a_run_without_an_allocation_has_no_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert summary(RunDir(tmp_path)) == ""
    with pytest.raises(ValueError, match="no Slurm allocation on record"):
        plot_timeline(tmp_path)
    assert plot_main([str(tmp_path), "--timeline"]) == 2
    assert "no Slurm allocation on record" in capsys.readouterr().err
