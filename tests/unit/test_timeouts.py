"""The timeout hierarchy (``hpc_train.runtime.timeouts``): the lead ``auto`` derives, the inversions refused
before submission and those warned about with the numbers a run dir measured, and the block the launcher and
the supervisor print."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.errors import ConfigError
from hpc_train.core.records import AttemptOutcome, AttemptRecord, Progress, RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.launch.sbatch import sbatch_flags
from hpc_train.runtime.observers import ProgressFile
from hpc_train.runtime.timeouts import (
    AUTO_DEFAULT_LEAD_S,
    Measured,
    derive_lead,
    job_end_time,
    kill_wait_s,
    measured,
    timeouts,
)
from hpc_train.tools.api import compose_config

SLURM = ["cluster=slurm", "cluster.timeout_min=60"]


def slurm(**overrides: object) -> ClusterConfig:
    return ClusterConfig(launcher="slurm", **overrides).resolved()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"signal_lead_s": "30"},
            r"cluster\.slurm\.signal_lead_s='30' .*shorter than srun's grace \(cluster\.slurm\.srun_wait_s=60\).*"
            r"HINT: raise cluster\.slurm\.signal_lead_s to 60 or more \(or auto\)",
        ),
        ({"signal_lead_s": "soon"}, r"signal_lead_s='soon' .*must be auto or a whole number of seconds"),
        ({"signal_lead_s": "70000"}, r"sbatch --signal takes at most 65535"),
        ({"signal_lead_s": "3600", "timeout_min": 60}, r"shorter than the time limit \(cluster\.timeout_min=60\)"),
    ],
)
def test_a_lead_that_cannot_work_is_refused_before_submission(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        slurm(**overrides)


def test_auto_and_whole_seconds_are_leads() -> None:
    assert slurm(signal_lead_s="auto").slurm.lead_auto
    assert slurm(signal_lead_s="auto", srun_wait_s=600, timeout_min=5).slurm.fixed_lead_s is None  # auto: derived
    assert slurm(signal_lead_s=120).slurm.fixed_lead_s == 120  # a number, as a Python caller gives it
    assert compose_config(*SLURM, "cluster.slurm.signal_lead_s=150").cluster.slurm.fixed_lead_s == 150  # the CLI
    assert slurm(signal_lead_s="10", srun_wait_s=5).slurm.fixed_lead_s == 10


def test_auto_derives_the_lead_from_the_stop_measured() -> None:
    auto = compose_config(*SLURM, "cluster.slurm.signal_lead_s=auto")
    first = derive_lead(auto, Measured())
    assert (first.seconds, first.auto) == (AUTO_DEFAULT_LEAD_S, True)
    assert "nothing measured yet" in first.source
    slow = derive_lead(auto, Measured(step_s=2.0, checkpoint_s=40.0))
    assert slow.seconds == 2 * 42 + 30 and "2 x the stop measured (42 s) + 30 s" in slow.source
    stopped = derive_lead(auto, Measured(step_s=2.0, checkpoint_s=40.0, stop_s=55.0))  # the slowest stop wins
    assert stopped.seconds == 2 * 55 + 30
    quick = derive_lead(auto, Measured(step_s=0.1, checkpoint_s=1.0))
    assert quick.seconds == 60 and "srun's grace" in quick.source  # never under cluster.slurm.srun_wait_s
    short = compose_config("cluster=slurm", "cluster.timeout_min=2", "cluster.slurm.signal_lead_s=auto")
    assert derive_lead(short, Measured(checkpoint_s=100.0)).seconds == 60  # at most half the time limit
    fixed = derive_lead(compose_config(*SLURM, "cluster.slurm.signal_lead_s=90"), Measured(checkpoint_s=100.0))
    assert (fixed.seconds, fixed.auto, fixed.source) == (90, False, "cluster.slurm.signal_lead_s=90")


def test_the_sbatch_signal_carries_the_lead_in_force() -> None:
    assert sbatch_flags(slurm(signal_lead_s="120"))["signal"] == "USR2@120"
    assert sbatch_flags(slurm(signal_lead_s="auto"))["signal"] == f"USR2@{AUTO_DEFAULT_LEAD_S}"
    assert sbatch_flags(slurm(signal_lead_s="auto"), lead_s=140)["signal"] == "USR2@140"


def test_the_run_dir_measures_steps_checkpoints_and_stops(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    assert measured(rd) == Measured()
    attempts = [
        AttemptRecord(
            attempt=0,
            outcome=AttemptOutcome.STOPPED,
            progress=Progress(first_step=1, first_time=100.0, step=101, time=150.0, checkpoint_s=7.5),
        ),
        AttemptRecord(
            attempt=1,
            outcome=AttemptOutcome.STOPPED,
            progress=Progress(first_step=102, first_time=200.0, step=202, time=300.0, checkpoint_s=3.0),
        ),
    ]
    rd.write_attempts(attempts)
    rd.append_restart(RequeueEntry(attempt=0, signal=12, stop_saved_s=9.0))
    rd.append_restart(RequeueEntry(attempt=1, signal=12, stop_saved_s=None))
    found = measured(rd)
    assert found == Measured(step_s=1.0, checkpoint_s=7.5, stop_s=9.0)  # the latest step, the slowest saves
    assert found.stop_need_s == 9.0
    assert Measured(step_s=1.0, checkpoint_s=12.0, stop_s=9.0).stop_need_s == 13.0


def test_inverted_pairs_are_warned_about_with_their_numbers(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    rd.append_restart(RequeueEntry(attempt=0, signal=12, stop_saved_s=75.0))
    rd.write_progress(0, Progress(first_step=1, first_time=1.0, step=11, time=11.0, checkpoint_s=70.0))
    cfg = compose_config(*SLURM, "trainer.watchdog_s=100", "trainer.dist_timeout_s=120")
    warnings = "\n".join(timeouts(cfg, measured(rd), kill_wait=30).warnings())
    assert "before the time limit" not in warnings  # 90 s covers the 75 s stop...
    cfg = compose_config(
        *SLURM, "cluster.slurm.signal_lead_s=60", "trainer.watchdog_s=100", "trainer.dist_timeout_s=120"
    )
    warnings = "\n".join(timeouts(cfg, measured(rd), kill_wait=30).warnings())
    assert (
        "comes 60 s before the time limit (cluster.slurm.signal_lead_s=60), but a stop in this run dir took 75 s"
        in (warnings)
    )  # ...60 s does not
    assert "Slurm then gives KillWait (30 s) before SIGKILL" in warnings
    assert "HINT: cluster.slurm.signal_lead_s=auto, or at least 180" in warnings
    assert "trainer.watchdog_s=100 is less than 2 x the slowest checkpoint measured (70 s)" in warnings
    assert "HINT: trainer.watchdog_s=140 or more" in warnings
    assert "trainer.dist_timeout_s=120 is less than 2 x" in warnings
    background = compose_config(*SLURM, "trainer.checkpoint_async=true", "trainer.dist_timeout_s=120")
    assert "dist_timeout_s" not in "\n".join(
        timeouts(background, measured(rd)).warnings()
    )  # no rank waits for the write
    auto = compose_config(*SLURM, "cluster.slurm.signal_lead_s=auto", "trainer.watchdog_s=600")
    assert timeouts(auto, measured(rd)).warnings() == []  # the lead covers the stop (2 x 75 + 30 = 180 s)


def test_the_block_names_every_timeout_in_one_place(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    lines = timeouts(compose_config(*SLURM, "cluster.slurm.signal_lead_s=auto"), measured(rd), kill_wait=5).lines()
    text = "\n".join(lines)
    assert lines[0] == "timeouts:" and len(lines) == 9, text
    for part in (
        "time limit        60 min (cluster.timeout_min)",
        f"USR2 {AUTO_DEFAULT_LEAD_S} s before it (signal_lead_s=auto: nothing measured yet",
        "not measured yet (a first run); checkpoints synchronous",
        "15 min (trainer.watchdog_s)",
        "5 min (trainer.dist_timeout_s)",
        "every 10 s (cluster.status_every_s)",
        "60 s for the others once a rank ended (cluster.slurm.srun_wait_s)",
        "KillWait          5 s: from SIGTERM at the time limit to SIGKILL",
    ):
        assert part in text, text
    here = timeouts(compose_config(*SLURM, "cluster.slurm.submit=here"), measured(rd), kill_wait=5).lines()
    assert not any("stop signal" in line for line in here)  # salloc's allocation: no --signal of ours
    local = timeouts(compose_config("cluster.failure_grace_s=15"), measured(rd)).lines()
    assert not any("stop signal" in line or "KillWait" in line for line in local)
    assert any("15 s for the others once a rank ended (cluster.failure_grace_s)" in line for line in local)


def test_slurms_answers_are_read_and_their_absence_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))  # (the fakes name their Python in full)
    assert kill_wait_s() is None and job_end_time("7") is None  # no Slurm here
    for name, body in (
        ("scontrol", "print('InactiveLimit = 0 sec\\nKillWait = 5 sec\\nMaxJobCount = 10000')"),
        ("squeue", "import sys; print('2026-11-27T14:05:33' if sys.argv[3] == '7' else 'N/A')"),
    ):
        (bindir / name).write_text(f"#!{sys.executable}\n{body}\n")
        (bindir / name).chmod(0o755)
    assert kill_wait_s() == 5
    from datetime import datetime

    assert job_end_time("7") == datetime(2026, 11, 27, 14, 5, 33).timestamp()
    assert job_end_time("8") is None


def test_the_progress_file_keeps_the_slowest_checkpoint(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    progress = ProgressFile(rd, 0)
    progress.on_start(0)
    progress.on_step(1)
    for step, seconds in ((1, 2.5), (2, 4.0), (3, 1.0)):
        progress.on_checkpoint_seconds(step, seconds)
        progress.on_saved(step)
    assert rd.progress_record(0).checkpoint_s == 4.0


def test_with_auto_the_supervisor_stops_the_step_its_lead_before_the_jobs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued job keeps the --signal it was submitted with; with auto the supervisor signals the step itself,
    the lead it derived for this attempt before the end Slurm gives (here: squeue says the job ends in 92 s,
    the lead of a run with nothing measured is 90 s)."""
    import time
    from datetime import datetime

    from .test_recovery import supervised

    bindir = tmp_path / "slurm"
    bindir.mkdir()
    ends = datetime.fromtimestamp(time.time() + AUTO_DEFAULT_LEAD_S + 2).isoformat(timespec="seconds")
    (bindir / "squeue").write_text(f"#!{sys.executable}\nprint('{ends}')\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    stopped = {"statuses": {"0": {"state": "stopped", "step": 12, "signal": 12, "host": "node1"}}}
    began = time.monotonic()
    code, rd, calls = supervised(tmp_path, [{"wait_for_signal": 30, **stopped}], signal_lead_s="auto")
    assert code == 0 and len(calls) == 1
    assert (tmp_path / "bin0" / "signalled.txt").read_text() == "True\n"  # the step got USR2...
    assert time.monotonic() - began < 20  # ...about 2 s in, not after the fake's 30 s
    (attempt,) = rd.attempt_records()
    assert attempt.outcome.value == "stopped"


def test_the_mirrors_wait_at_a_stop_is_in_the_block_and_warned_when_it_outlasts_the_lead(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    plain = timeouts(compose_config(*SLURM), measured(rd))
    assert not any("mirror" in line for line in plain.lines()) and not plain.warnings()
    fits = timeouts(compose_config(*SLURM, "trainer.mirror=/project/m", "trainer.mirror_wait_s=30"), measured(rd))
    assert any("a stop waits 30 s at most for the last copy (trainer.mirror_wait_s)" in line for line in fits.lines())
    assert not fits.warnings()
    (long,) = timeouts(
        compose_config(*SLURM, "trainer.mirror=s3://b/m", "trainer.mirror_wait_s=120"), measured(rd)
    ).warnings()
    assert "trainer.mirror_wait_s=120 is not shorter than the stop signal's lead (90 s)" in long
    assert "HINT: trainer.mirror_wait_s=30" in long
