"""Job state from squeue, sacct and rank files, with fake scheduler commands at the subprocess boundary."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir, write_json_atomic
from hpc_train.launch.state import job_state
from hpc_train.tools.jobs import main as jobs_main
from hpc_train.tools.jobs import resolve_target


def fake(bin_dir: Path, name: str, stdout: str = "", code: int = 0, stderr: str = "") -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\necho '{stderr}' >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


GONE = "slurm_load_jobs error: Invalid job id specified"
UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
NO_DBD = "sacct: error: Problem talking to the database: Connection refused"


@pytest.fixture
def scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Install fake squeue/sacct: a string is what they print; None: squeue no longer lists the job, sacct
    cannot reach slurmdbd; squeue="unreachable": squeue cannot reach slurmctld."""
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}")

    def install(squeue: str | None, sacct: str | None) -> None:
        if squeue == "unreachable":
            fake(bin_dir, "squeue", code=1, stderr=UNREACHABLE)
        else:
            fake(bin_dir, "squeue", squeue or "", 0 if squeue is not None else 1, GONE)
        fake(bin_dir, "sacct", sacct or "", 0 if sacct is not None else 1, NO_DBD)

    return install


def run_dir_with(tmp_path: Path, job_id: str | None, states: dict[int, str]) -> RunDir:
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    if job_id:
        write_json_atomic(rd.job_record, {"job_id": job_id})
    for rank, state in states.items():
        extra = {"error": "RuntimeError: boom"} if state == "failed" else {"step": 40}
        rd.write_status(rank, state, **extra)
    return rd


def test_all_ranks_completed(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue="COMPLETED\n", sacct="COMPLETED\n")
    state = job_state(run_dir_with(tmp_path, "5", {0: "completed", 1: "completed"}), 2)
    assert (state.state, state.done, state.ok) == ("COMPLETED", True, True)


def test_running_per_squeue(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue="RUNNING\n", sacct=None)
    state = job_state(run_dir_with(tmp_path, "5", {0: "running", 1: "running"}), 2)
    assert (state.state, state.done) == ("RUNNING", False)


def test_pending_before_any_rank(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue="PENDING\n", sacct="PENDING\n")
    assert job_state(run_dir_with(tmp_path, "5", {}), 2).state == "PENDING"


def test_gone_without_accounting_names_the_silent_rank(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    """A SIGKILLed rank never writes its end; with slurmdbd down only the files tell."""
    scheduler(squeue=None, sacct=None)
    state = job_state(run_dir_with(tmp_path, "5", {0: "failed", 1: "running"}), 2)
    assert (state.state, state.done, state.ok) == ("FAILED", True, False)
    assert state.detail.startswith("rank 1 on ") and "stopped reporting after step 40" in state.detail
    assert "rank 0 on" in state.detail and "boom" in state.detail


def test_scheduler_terminal_state_wins_when_ranks_unfinished(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue=None, sacct="CANCELLED by 0\n")
    state = job_state(run_dir_with(tmp_path, "5", {0: "running", 1: "running"}), 2)
    assert (state.state, state.done) == ("CANCELLED", True)


def test_completed_by_slurm_but_not_by_ranks_is_a_failure(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue="COMPLETED\n", sacct=None)
    state = job_state(run_dir_with(tmp_path, "5", {0: "completed"}), 2)
    assert state.state == "FAILED" and "rank 1 never started" in state.detail


def test_batch_exit_code_is_reported(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue=None, sacct=None)
    rd = run_dir_with(tmp_path, "5", {0: "running"})
    write_json_atomic(rd.status_dir / "batch_exit.json", {"job_id": "5", "exit_code": 137})
    assert "the job script exited with status 137" in job_state(rd, 1).detail


def test_unreachable_controller_is_not_a_verdict(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    """squeue failing to reach slurmctld must not make a running job look ended (wait would give up on it)."""
    scheduler(squeue="unreachable", sacct=None)
    state = job_state(run_dir_with(tmp_path, "5", {0: "running", 1: "running"}), 2)
    assert (state.state, state.done) == ("UNKNOWN", False)
    assert "could not reach slurmctld" in state.detail


def test_never_started_and_gone(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue=None, sacct=None)
    assert job_state(run_dir_with(tmp_path, "5", {}), 2).state == "ENDED"


def test_no_scheduler_commands_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    state = job_state(run_dir_with(tmp_path, "5", {0: "completed", 1: "completed"}), 2)
    assert state.state == "COMPLETED"


def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun" / "sweep"
    for i, lr in enumerate(["0.1", "0.2"]):
        rd = RunDir(root / str(i))
        rd.path.mkdir(parents=True)
        rd.config.write_text(
            "cluster: {tasks_per_node: 2}\ndata: {}\ntrainer: {}\nmodel: {name: mlp}\noptim: {name: adamw}\n"
        )
        write_json_atomic(
            rd.job_record,
            {"job_id": f"70_{i}", "array_job_id": "70", "overrides": ["cluster=slurm", f"trainer.lr={lr}"]},
        )
        for rank in range(2):
            rd.write_status(rank, "completed", step=10)
        rd.metrics.write_text(
            json.dumps({"step": 10, "train_loss": 0.5, "val_loss": 0.25 * (i + 1), "val_acc": 0.9}) + "\n"
        )
    return root


def test_job_id_lookup(tmp_path: Path) -> None:
    root = sweep(tmp_path)
    assert [rd.path for rd in resolve_target("70_1", [tmp_path / "multirun"])] == [root / "1"]
    assert len(resolve_target("70", [tmp_path / "multirun"])) == 2
    assert len(resolve_target(str(root), [])) == 2


def test_collect_lists_elements_with_their_own_overrides(
    tmp_path: Path, scheduler, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue=None, sacct=None)
    assert jobs_main(["collect", str(sweep(tmp_path))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#", "overrides", "job", "state", "step", "train_loss", "val_loss", "val_acc"]
    assert lines[1].split() == ["0", "trainer.lr=0.1", "70_0", "COMPLETED", "10", "0.5", "0.25", "0.9"]
    assert lines[2].split()[1:4] == ["trainer.lr=0.2", "70_1", "COMPLETED"]


def test_unknown_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert jobs_main(["--search", str(tmp_path), "status", "999"]) == 2
    assert "no run dir under" in capsys.readouterr().err


def test_sacct_is_not_asked_while_squeue_lists_the_job(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler(squeue="RUNNING\n", sacct="RUNNING\n")
    sacct = tmp_path / "bin" / "sacct"
    sacct.write_text(f"#!/bin/sh\ntouch {tmp_path / 'sacct-called'}\necho RUNNING\n")
    assert job_state(run_dir_with(tmp_path, "5", {0: "running"}), 1).state == "RUNNING"
    assert not (tmp_path / "sacct-called").exists()
    scheduler(squeue=None, sacct="TIMEOUT\n")
    assert job_state(RunDir(tmp_path / "run"), 1).state == "TIMEOUT"


def test_sbatch_job_id_ignores_warnings_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_train.config import ClusterConfig
    from hpc_train.launch.sbatch import job_spec
    from hpc_train.launch.slurm import _submit_sbatch

    fake(tmp_path / "bin", "sbatch", "4242;testbed\n", 0, "sbatch: warning: no --mem given, using the default")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    spec = job_spec(ClusterConfig(launcher="slurm"), [tmp_path], tmp_path / "logs")
    job_id, outputs = _submit_sbatch(tmp_path / "job.sbatch", spec)
    assert job_id == "4242" and outputs == [str(tmp_path / "logs" / "slurm-4242.out")]


def test_metrics_reader_skips_a_row_being_written(tmp_path: Path) -> None:
    from hpc_train.core.metrics import last_metrics, read_metrics

    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == [] and last_metrics(path) == {}
    path.write_text('{"step": 10, "train_loss": 1.5}\n{"step": 10, "val_loss": 2.0}\n{"step": 20, "train_lo')
    assert [r["step"] for r in read_metrics(path)] == [10, 10]
    assert last_metrics(path) == {"step": 10, "train_loss": 1.5, "val_loss": 2.0}


def test_a_failed_submission_folder_is_no_sweep_and_a_broken_config_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run refused before it wrote its config.yaml leaves only Hydra's .hydra/ (which has a config.yaml of its
    own): it names no run. A run dir whose config.yaml no longer validates is refused with the config error."""
    refused = tmp_path / "refused"
    (refused / ".hydra").mkdir(parents=True)
    (refused / ".hydra" / "config.yaml").write_text("cluster: {spare_nodes: -1}\n")
    assert jobs_main(["status", str(refused)]) == 2
    assert "neither a run dir" in capsys.readouterr().err
    broken = RunDir(tmp_path / "broken")
    broken.path.mkdir()
    broken.config.write_text("cluster: {launcher: slurm, spare_nodes: -1}\nmodel: {name: mlp}\noptim: {name: adamw}\n")
    assert jobs_main(["status", str(broken.path)]) == 2
    assert "cluster.spare_nodes=-1 is invalid" in capsys.readouterr().err
