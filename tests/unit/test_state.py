"""Job state from squeue, sacct and rank files, with fake scheduler commands at the subprocess boundary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpc_train.core.rundir import RunDir, run_labels, write_json_atomic
from hpc_train.core.state import process_start, signal_live_ranks
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
    assert "cluster.slurm.spare_nodes=-1 is invalid" in capsys.readouterr().err


# ---- local runs: whether the ranks' processes run ------------------------------------------------------------


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def local_run(tmp_path: Path, states: dict[int, str], overrides: list[str] | None = None, **extra: Any) -> RunDir:
    """A local run dir (a config of 2 ranks, no job.json) whose ranks last wrote ``states`` from this process."""
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.config.write_text("cluster: {tasks_per_node: 2}\nmodel: {name: mlp}\noptim: {name: adamw}\n")
    rd.write_overrides(overrides or [])
    for rank, state in states.items():
        rd.write_status(rank, state, **{"step": 40, **extra})
    return rd


def test_a_script_that_reports_no_step_is_not_at_step_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rd = local_run(tmp_path, {0: "stopped", 1: "stopped"}, step=None)
    detail = job_state(rd, 2).detail
    assert detail.startswith("stopped (the script reported no step) on a signal") and "None" not in detail


def test_local_run_stopped_on_a_signal_says_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rd = local_run(tmp_path, {0: "stopped", 1: "stopped"}, ["trainer.lr=0.1", "data.name=a b"])
    state = job_state(rd, 2)
    assert (state.state, state.done, state.ok) == ("STOPPED", True, False)
    resume = f"python -m hpc_train hydra.run.dir={rd.path} trainer.lr=0.1 'data.name=a b'"
    assert state.detail == f"stopped at step 40 on a signal; resume: {resume}"
    assert jobs_main(["status", str(rd.path)]) == 0
    assert "STOPPED" in capsys.readouterr().out


def test_local_rank_whose_process_is_gone_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C twice, kill -9 or a closed terminal: the ranks never write their end, and their pids are gone."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rd = local_run(tmp_path, {0: "running", 1: "running"}, pid=dead_pid())
    rd.checkpoint(20).parent.mkdir()
    rd.checkpoint(20).write_bytes(b"")
    state = job_state(rd, 2)
    assert (state.state, state.done) == ("FAILED", True)
    assert "rank 0 on " in state.detail and "exited without reporting" in state.detail
    assert f"resume from step_000000020.pt: python -m hpc_train hydra.run.dir={rd.path}" in state.detail


def test_local_run_whose_processes_run_is_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    state = job_state(local_run(tmp_path, {0: "running", 1: "starting"}), 2)  # this test's process wrote them
    assert (state.state, state.done) == ("RUNNING", False)
    assert str(os.getpid()) in state.detail


def test_a_reused_pid_is_not_the_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pid runs, but the process holding it started at another time than the rank's did."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = process_start(other.pid)
        assert started is not None and process_start(dead_pid()) is None
        rd = local_run(tmp_path, {0: "running", 1: "running"}, pid=other.pid, pid_start=started - 1)
        assert job_state(rd, 2).state == "FAILED"
        assert signal_live_ranks(rd.rank_statuses()) == []  # jobs cancel leaves the process holding the pid alone
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


BASH, SLEEP = shutil.which("bash") or "bash", shutil.which("sleep") or "sleep"  # found before PATH is emptied


def sleeper(argv0: str = "sleep") -> subprocess.Popen[bytes]:
    """A live process that is no rank (``exec -a`` gives it the command name ``argv0``)."""
    return subprocess.Popen([BASH, "-c", f"exec -a {argv0} {SLEEP} 60"])


def cancel_local(rd: RunDir, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = jobs_main(["cancel", str(rd.path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def survives(proc: subprocess.Popen[bytes]) -> bool:
    """True when ``proc`` is still running a moment later (a SIGTERM to sleep ends it at once)."""
    try:
        proc.wait(timeout=0.1)
    except subprocess.TimeoutExpired:
        return True
    return False


@pytest.mark.parametrize("record", ["another pid_start", "no pid_start"])
def test_cancel_leaves_a_process_alone_that_cannot_be_verified_to_be_the_rank(
    record: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale status names a pid that now belongs to an unrelated process: cancel must not signal it."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    other = sleeper()
    try:
        assert wait_for_exec(other, "sleep")
        started = process_start(other.pid)
        assert started is not None
        rd = local_run(tmp_path, {0: "running"}, pid=other.pid, pid_start=started - 1)
        if record == "no pid_start":  # a run dir older than pid_start
            status = json.loads(rd.status_path(0).read_text())
            del status["pid_start"]
            write_json_atomic(rd.status_path(0), status)
            why = f"the status records no pid_start (an older run dir) and process {other.pid} runs 'sleep 60'"
        else:
            why = f"process {other.pid} started at {started} clock ticks after boot, the rank at {started - 1}"
        code, out, err = cancel_local(rd, capsys)
        assert survives(other)
        assert code == 1 and "sent SIGTERM" not in out
        assert f"rank 0 of {rd.path} (pid {other.pid}) was not signalled: {why}" in err
        assert "the pid now belongs to another process" in err and "HINT:" in err
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("record", ["its pid_start", "no pid_start, a rank's command line"])
def test_cancel_signals_a_rank_whose_identity_is_verified(
    record: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rank = sleeper("hpc_train.worker" if record.startswith("no") else "sleep")
    try:
        assert wait_for_exec(rank, "sleep")
        rd = local_run(tmp_path, {0: "running", 1: "completed"}, pid=rank.pid, pid_start=process_start(rank.pid))
        if record.startswith("no"):
            status = json.loads(rd.status_path(0).read_text())
            del status["pid_start"]
            write_json_atomic(rd.status_path(0), status)
        code, out, err = cancel_local(rd, capsys)
        assert (code, out, err) == (0, f"sent SIGTERM to rank 0 (pid {rank.pid})\n", "")
        assert rank.wait(timeout=5) == -signal.SIGTERM
        code, out, err = cancel_local(rd, capsys)  # its process is gone: nothing to do, nothing refused
        assert (code, err) == (0, "") and "nothing to cancel" in out
    finally:
        rank.kill()
        rank.wait()


def wait_for_exec(proc: subprocess.Popen[bytes], name: str, timeout_s: float = 5.0) -> bool:
    """True once ``proc`` runs ``name`` (bash has exec'd it): before that its start time is bash's own, the same,
    but its command line is still bash's."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(f"/proc/{proc.pid}/comm").read_text().strip() == name:
            return True
        time.sleep(0.005)
    return False


def test_signal_live_ranks_says_why_it_leaves_a_rank_alone(tmp_path: Path) -> None:
    rd = local_run(tmp_path, {0: "running", 1: "running"}, host="elsewhere")
    patch = json.loads(rd.status_path(1).read_text())
    write_json_atomic(rd.status_path(1), {**patch, "host": socket.gethostname(), "pid": "x"})
    refused: list[tuple[int, str]] = []
    assert signal_live_ranks(rd.rank_statuses(), refused=lambda rank, why: refused.append((rank, why))) == []
    assert refused == [
        (
            0,
            f"it ran on host 'elsewhere', not on this one ({socket.gethostname()}): its pid cannot be checked from here",
        ),
        (1, "its status records no process id"),  # (pid="x" is left out of the typed record)
    ]


def test_local_rank_on_another_host_cannot_be_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    state = job_state(local_run(tmp_path, {0: "running", 1: "running"}, host="elsewhere", pid=dead_pid()), 2)
    assert (state.state, state.done) == ("RUNNING?", False) and "elsewhere" in state.detail


# ---- the overrides that made a run, as its label -------------------------------------------------------------


def local_sweep(tmp_path: Path) -> Path:
    """A local sweep: overrides.json in each element, no job.json; a user's metric and an extra number."""
    root = tmp_path / "multirun" / "local"
    for i, lr in enumerate(["0.1", "0.2"]):
        rd = RunDir(root / str(i))
        rd.path.mkdir(parents=True)
        rd.config.write_text("cluster: {tasks_per_node: 1}\nmodel: {name: mlp}\noptim: {name: adamw}\n")
        rd.write_overrides(["model=mlp", f"trainer.lr={lr}"])
        rd.write_status(0, "completed", step=10)
        row = {"step": 10, "train_loss": 0.5, "val_loss": 0.25, "val_metric": 0.75 + i / 10, "bleu": 30 + i}
        rd.metrics.write_text(json.dumps({**row, "lr": 0.1, "val_samples": 64, "best": True}) + "\n")
    return root


def test_collect_labels_a_local_sweep_and_shows_every_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert jobs_main(["collect", str(local_sweep(tmp_path))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "#",
        "overrides",
        "job",
        "state",
        "step",
        "train_loss",
        "val_loss",
        "bleu",
        "val_metric",
    ]
    assert lines[1].split() == ["0", "trainer.lr=0.1", "-", "COMPLETED", "10", "0.5", "0.25", "30", "0.75"]
    assert lines[2].split()[:2] == ["1", "trainer.lr=0.2"] and lines[2].split()[-1] == "0.85"


def test_overrides_of_older_run_dirs_come_from_job_json_or_hydra(tmp_path: Path) -> None:
    slurm, hydra = RunDir(tmp_path / "slurm"), RunDir(tmp_path / "hydra")
    write_json_atomic(slurm.job_record, {"job_id": "5", "overrides": ["cluster=slurm"]})
    (hydra.path / ".hydra").mkdir(parents=True)
    (hydra.path / ".hydra" / "overrides.yaml").write_text("- trainer.lr=0.1\n- 'data.name=a: b'\n")
    assert slurm.read_overrides() == ["cluster=slurm"]
    assert hydra.read_overrides() == ["trainer.lr=0.1", "data.name=a: b"]
    assert RunDir(tmp_path / "none").read_overrides() == []
    assert run_labels([slurm, hydra]) == ["cluster=slurm", "trainer.lr=0.1 data.name=a: b"]


def test_write_config_records_the_overrides_of_the_hydra_job(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    from hpc_train.config import register_configs
    from hpc_train.launch import write_config
    from hpc_train.tools.api import compose_config

    cfg = compose_config("trainer.lr=0.5")
    write_config(cfg, RunDir(tmp_path / "given"), ["trainer.lr=0.5"])  # a Slurm array element's
    assert RunDir(tmp_path / "given").read_overrides() == ["trainer.lr=0.5"]
    register_configs()
    with initialize_config_module(config_module="hpc_train.conf", version_base="1.3"):
        raw = compose(config_name="config", overrides=["trainer.lr=0.5"], return_hydra_config=True)
    HydraConfig.instance().set_config(raw)  # what Hydra does for a run, or a local sweep's element
    try:
        write_config(cfg, RunDir(tmp_path / "hydra"))
    finally:
        HydraConfig.instance().cfg = None
    assert RunDir(tmp_path / "hydra").read_overrides() == ["trainer.lr=0.5"]


def test_plot_compare_and_tensorboard_name_runs_by_their_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpc_train.train import plots

    root = local_sweep(tmp_path)
    figures: list[Any] = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    plots.plot_compare([root / "0", root / "1"], tmp_path / "compare.png")
    assert figures[0].axes[0].get_legend_handles_labels()[1] == ["trainer.lr=0.1", "trainer.lr=0.2"]
    plots.pyplot().close(figures[0])
    element = RunDir(root / "0")
    assert element.tensorboard_run == element.tensorboard / "model=mlp,trainer.lr=0.1"
    element.write_overrides(["data.path=/a/b"])
    assert element.tensorboard_run == element.tensorboard / "data.path=_a_b"
    element.write_overrides([])
    assert element.tensorboard_run == element.tensorboard


def test_children_are_listed_from_proc_and_a_reaped_one_is_not_alive() -> None:
    """child_pids reads /proc/<pid>/task/*/children (the launcher polls it 5 times a second), and finds what a scan
    of every /proc/<pid>/stat finds; child_alive tells a running child from one that exited (a zombie) and from
    a pid that is not this parent's."""
    from hpc_train.core.state import _scanned_children, child_alive, child_pids

    me = os.getpid()
    children = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        pids = sorted(c.pid for c in children)
        assert [p for p in child_pids(me) if p in pids] == pids
        assert [p for p in _scanned_children(me) if p in pids] == pids
        assert all(child_alive(p, me) for p in pids) and not child_alive(pids[0], os.getppid())
        children[0].kill()
        deadline = time.monotonic() + 10
        while child_alive(children[0].pid, me):  # a zombie until reaped: not alive either
            assert time.monotonic() < deadline, "a killed child still reads as alive"
            time.sleep(0.01)
        children[0].wait()
        assert children[0].pid not in child_pids(me) and not child_alive(children[0].pid, me)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert child_pids(2**22 + 1) == []  # beyond pid_max: no such process


def test_many_failures_and_missing_ranks_are_named_in_a_few_lines(tmp_path: Path, scheduler) -> None:  # type: ignore[no-untyped-def]
    """A job of 4,096 ranks whose collective failed everywhere: the first five failures, then a count."""
    scheduler(squeue=None, sacct="FAILED\n")
    states = dict.fromkeys(range(3000), "failed")
    state = job_state(run_dir_with(tmp_path, "5", states), 4096)
    parts = state.detail.split("; ")
    assert len(parts) == 7, state.detail[:2000]
    assert parts[0] == "ranks 3000-4095 never started (1096 ranks)"
    assert parts[1].startswith("rank 0 on ") and "RuntimeError: boom" in parts[1]
    assert parts[6] == "2995 more ranks failed: 5-2999"


def test_number_ranges_first_few_and_hostlists() -> None:
    from hpc_train.core.hostlist import compress_hostlist
    from hpc_train.core.textutil import first_few, number_ranges

    assert number_ranges([5, 0, 1, 2, 3, 8, 10, 11]) == "0-3,5,8,10,11"
    assert number_ranges([]) == ""
    assert first_few(["a", "b"], 3) == "a, b" and first_few(list("abcdefg"), 3) == "a, b, c and 4 more"
    assert compress_hostlist(["node3", "node1", "node2", "gpu07", "node2"]) == "gpu07,node[1-3]"


def test_jobs_status_reads_the_nodes_summaries_once_per_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1,024 nodes a read of the summaries is a thousand files: the state, the progress, the nodes heard and
    the start-up of one run dir come from one read."""
    from hpc_train.core import rundir as rundir_module
    from hpc_train.core.files import write_json_atomic
    from hpc_train.core.records import NodeSummary, RankStatus, StartupProfile

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rd = local_run(tmp_path, {0: "running"}, pid=os.getpid())
    for n, host in enumerate(("n1", "n2", "n3")):
        ranks = tuple(RankStatus(rank=r, state="running", host=host, time=time.time(), step=40) for r in (2 * n + 1,))
        startup = (StartupProfile(rank=2 * n + 1, host=host, imports_s=2.0 + n),)
        write_json_atomic(
            rd.node_summary(host), NodeSummary(host=host, time=time.time(), ranks=ranks, startup=startup).to_json()
        )
    reads: list[str] = []
    real = rundir_module.read_json

    def counted(path: Path) -> object:
        if path.name.startswith("node_"):
            reads.append(path.name)
        return real(path)

    monkeypatch.setattr(rundir_module, "read_json", counted)
    assert jobs_main(["status", str(rd.path)]) == 0
    assert "imports 4.00 (rank 5, n3)" in capsys.readouterr().out  # the summaries were read, and used
    assert sorted(reads) == ["node_n1.json", "node_n2.json", "node_n3.json"], reads


def test_a_run_stopped_before_a_rank_started_reads_stopped_with_the_command_to_start_it_again(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the ranks are still starting: the local launcher ends its job and says so in the run dir
    (status/interrupted.json), so the run reads STOPPED, nothing trained, not UNKNOWN; so does the CLI for a
    Ctrl-C before the launcher took it over. A run dir whose launcher runs and no rank wrote to is STARTING."""
    from hpc_train.core import owner

    rd = run_dir_with(tmp_path, None, {})
    rd.overrides.write_text('["trainer.max_steps=5"]\n')
    rd.status_dir.mkdir()
    with owner.claim(rd.path, "local", heartbeat=False):
        assert (job_state(rd, 2).state, job_state(rd, 2).done) == ("STARTING", False)
    # No launcher and no word from one (a launcher about to claim it): nothing to conclude yet.
    assert (job_state(rd, 2).state, job_state(rd, 2).done) == ("UNKNOWN", False)
    rd.write_interrupted("")  # the CLI's Ctrl-C before a launcher took it over
    state = job_state(rd, 2)
    assert (state.state, state.done) == ("STOPPED", True)
    assert "stopped during start-up (the launch ended on Ctrl-C at" in state.detail
    rd.write_interrupted("4242")
    rd.write_status(0, "starting", pid=2**22 + 7)  # a rank that was still starting, ended with its job
    state = job_state(rd, 2)
    assert (state.state, state.done) == ("STOPPED", True)
    assert "stopped during start-up (local job 4242 ended on Ctrl-C" in state.detail
    assert (
        "start it again: python -m hpc_train hydra.run.dir=" in state.detail and "trainer.max_steps=5" in state.detail
    )
    rd.clear_statuses()  # a new launch
    assert not rd.interrupted.exists()


def test_the_run_plots_legends_cover_no_data_and_no_axis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each legend of plots/loss.png and plots/metrics.png sits above the plot area, clear of its lines, its
    ticks and its axis labels (the metrics plot's used to cover its x axis)."""
    from hpc_train.train import plots

    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rows = [{"step": s, "train_loss": 2.0 / s, "lr": 1e-3, "val_loss": 1.0 / s, "val_acc": 0.8} for s in (1, 2, 3)]
    rd.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures: list[Any] = []
    monkeypatch.setattr(plots, "save", lambda fig, path: (fig.tight_layout(), figures.append(fig))[1] or path)
    plots.plot_run(rd.path)
    assert len(figures) == 2
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (legend,) = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "the legend covers the plot area"
            for label in (ax.xaxis.label, ax.yaxis.label):
                assert not box.overlaps(label.get_window_extent(renderer)), "the legend covers an axis label"
            axis = ax.xaxis.get_tightbbox(renderer)  # (None for a twin's hidden x axis)
            assert axis is None or not box.overlaps(axis), "the legend covers the x axis"
        assert box.y0 >= fig.axes[0].get_window_extent(renderer).y1
        plots.pyplot().close(fig)


def test_jobs_status_of_a_pack_member_names_its_pack(  # type: ignore[no-untyped-def]
    tmp_path: Path, scheduler, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member of a pack (cluster.pack): its job record's place in the pack reaches the table and --json."""
    from hpc_train.core.records import JobRecord, PackPlace

    scheduler(squeue="RUNNING\n", sacct=None)
    config = "cluster: {launcher: slurm, tasks_per_node: 1}\nmodel: {name: mlp}\noptim: {name: adamw}\n"
    members = [RunDir(tmp_path / "sweep" / str(i)) for i in range(2)]
    place = tuple(str(m.path.resolve()) for m in members)
    for i, rd in enumerate(members):
        rd.status_dir.mkdir(parents=True)
        rd.config.write_text(config)
        rd.write_job_record(JobRecord(job_id="7_0", pack=PackPlace(index=i, members=place)))
    assert jobs_main(["status", str(members[1].path)]) == 0
    assert "pack member 1 of 2 in job 7_0" in capsys.readouterr().out
    assert jobs_main(["status", "--json", str(members[0].path)]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["pack"] == {"index": 0, "members": list(place)} and record["pack_goodput"] is not None
