"""Stop on a signal, checkpoint on every rank, resume exactly; watchdog and preflight. Real local multi-process runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpc_train.core.rundir import RunDir

from ..conftest import Background, assert_bitwise_equal, start_in_foreground, wait_for_ranks

# Dropout draws from each rank's own generator; 1400 samples / (2 x 32) = 19 steps an epoch, so 35 steps cross an
# epoch boundary and a stop at step 13 is mid-epoch.
JOB = [
    "trainer.max_steps=35",
    "trainer.max_epochs=0",
    "data.num_samples=1400",
    "trainer.batch_size=32",
    "model.dropout=0.2",
    "trainer.log_every_n_steps=5",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train_loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Background:
    """The uninterrupted run, beside the first test's interrupted one (the faults fire at fixed steps)."""
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *JOB]
    return Background(argv, run_dir, run_dir.parent / "launcher.out", timeout=240)


@pytest.mark.parametrize(
    ("fault", "resumed_with"),
    [("rank=1,step=13,kind=term", []), ("rank=0,step=18,kind=usr2", ["data.on_device=true"])],
)
def test_stop_and_resume_is_bit_identical(run_cli, baseline: Background, fault: str, resumed_with: list[str]) -> None:  # type: ignore[no-untyped-def]
    """A signal to one rank stops all of them at the same step with one checkpoint; the rerun finishes exactly.
    The second rerun reads its data from a set kept where the model is (data.on_device): the same batches as
    the DataLoader's, and the same random draws, so still the uninterrupted run bit for bit."""
    stopped, run_dir = run_cli(*JOB, env={"HPC_TRAIN_FAULT": fault})
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    # The ranks read the stop flags one step late (the reduction overlaps the next step): all stop at the step
    # after the signal. 18 + 1 = 19 is the last step of the first epoch.
    step = int(fault.split("step=")[1].split(",")[0]) + 1
    statuses = RunDir(run_dir).read_statuses()
    assert {s["state"] for s in statuses.values()} == {"stopped"} and {s["step"] for s in statuses.values()} == {step}
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")] == [f"step_{step:09d}.pt"]
    assert f"stopped at step {step}" in stopped.stderr and "resume: python -m hpc_train" in stopped.stderr

    resumed, _ = run_cli(*JOB, *resumed_with, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(baseline.ready(), run_dir)
    assert losses(run_dir) == losses(baseline.ready())  # metrics rows too: none lost, none twice
    assert (run_dir / "logs" / "rank_0.restart1.log").is_file() and (run_dir / "logs" / "rank_1.log").is_file()
    assert "resumed from" in (run_dir / "logs" / "rank_0.restart1.log").read_text()


def test_damaged_newest_checkpoint_is_skipped(run_cli, baseline: Background) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL halfway through writing a checkpoint, then bits flipped in the newest one that was written, and a
    foreign file where the next one goes: the resumed run removes the killed writer's temp file, sets the damaged
    checkpoint aside, takes the one before, keeps the foreign file, and still ends bit-identical."""
    job = [*JOB, "trainer.checkpoint_every_n_steps=5", "cluster.failure_grace_s=2"]
    killed, run_dir = run_cli(*job, env={"HPC_TRAIN_FAULT": "rank=0,step=15,kind=killsave"})
    assert killed.returncode == 1, killed.stderr[-2000:]
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_000000005.pt", "step_000000010.pt"]
    assert (folder / ".step_000000015.pt.tmp").is_file(), "the half-written file should be left as a temp file"
    # Bits flipped in the middle of the newest checkpoint (a disk or copy error): torch alone would load it.
    data = bytearray((folder / "step_000000010.pt").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    (folder / "step_000000010.pt").write_bytes(bytes(data))
    (folder / "step_000000015.pt").write_bytes(b"not ours")

    resumed, _ = run_cli(*job, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert "set aside as step_000000010.pt.damaged" in log and "resumed from" in log and "step_000000005.pt" in log
    assert not list(folder.glob(".*.tmp")) and (folder / "step_000000010.pt.damaged").is_file()
    assert [p.read_bytes() for p in folder.glob("step_000000015.pt.not-ours-*")] == [b"not ours"]
    assert_bitwise_equal(baseline.ready(), run_dir)


def test_background_checkpoints_survive_a_kill_mid_write_and_resume_exactly(run_cli, baseline: Background) -> None:  # type: ignore[no-untyped-def]
    """trainer.checkpoint_async: SIGKILL halfway through the background write of step 15's checkpoint leaves
    step 10's as the newest complete one; the rerun resumes from it, is stopped by a signal (the stop waits until
    its checkpoint is durable), and the last run ends bit-identical to the uninterrupted one."""
    job = [*JOB, "trainer.checkpoint_every_n_steps=5", "trainer.checkpoint_async=true", "cluster.failure_grace_s=2"]
    killed, run_dir = run_cli(*job, env={"HPC_TRAIN_FAULT": "rank=0,step=15,kind=killsave"})
    assert killed.returncode == 1, killed.stderr[-2000:]
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_000000005.pt", "step_000000010.pt"]
    assert (folder / ".step_000000015.pt.tmp").is_file(), "the half-written file should be left as a temp file"
    log = (run_dir / "logs" / "rank_0.log").read_text()
    # Killed in the writer thread, after the copy: never durable.
    assert "checkpoint (periodic) at step 15: blocked" in log and "checkpoint of step 15 durable" not in log
    assert "checkpoint of step 10 durable after" in log

    stopped, _ = run_cli(*job, run_dir=run_dir, env={"HPC_TRAIN_FAULT": "rank=1,step=23,kind=term,attempt=1"})
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert "resumed from" in log and "step_000000010.pt" in log and not list(folder.glob(".*.tmp"))
    assert "checkpoint (signal 15) at step 24: blocked" in log and "checkpoint of step 24 durable after" in log
    assert {s["step"] for s in RunDir(run_dir).read_statuses().values()} == {24}

    finished, _ = run_cli(*job, run_dir=run_dir)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_bitwise_equal(baseline.ready(), run_dir)


def test_divergence_stops_the_run_and_keeps_the_last_finite_state(run_cli) -> None:  # type: ignore[no-untyped-def]
    """Review of main: optim=sgd trainer.lr=3000 went NaN at step 10, ran on, exited 0, and rotation deleted the
    last finite checkpoint. Now the ranks agree on the first non-finite step, end as diverged, exit non-zero, and
    every checkpoint left is finite."""
    job = [*JOB, "optim=sgd", "trainer.lr=3000", "trainer.checkpoint_every_n_steps=2", "trainer.keep_checkpoints=1"]
    proc, run_dir = run_cli(*job)
    assert proc.returncode == 1, proc.stderr[-3000:]
    statuses = RunDir(run_dir).read_statuses()
    assert {s["state"] for s in statuses.values()} == {"failed"}
    assert all(s["error"].startswith("Diverged: training diverged") for s in statuses.values()), statuses
    assert "HINT: lower trainer.lr" in statuses[0]["error"]
    assert not (run_dir / "model_final.pt").exists()
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    assert len(checkpoints) == 1, checkpoints
    state = torch.load(checkpoints[0], weights_only=True)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert all(s["step"] < 10 for s in statuses.values()), "the run went on after it diverged"
    # From a real failure report: classified as its own fatal kind, so Slurm neither retries nor requeues it.
    from hpc_train.runtime.failures import SrunReport, classify

    failure = classify(RunDir(run_dir).rank_statuses(), SrunReport.parse([]), 1)  # typed: core.records.RankStatus
    assert failure.kind == "diverged" and not failure.retryable


@pytest.mark.parametrize("kind", ["hang", "freeze"])
def test_watchdog_ends_a_hung_job(run_cli, kind: str) -> None:  # type: ignore[no-untyped-def]
    """One rank sleeps inside a step (or is SIGSTOPped): the live ranks dump their stacks and the job ends."""
    start = time.monotonic()
    proc, run_dir = run_cli(
        *JOB,
        "trainer.max_steps=100000",
        # Start-up (from the rendezvous to the first step) took 12 s in a clean-clone run, with the testbed's
        # jobs beside it on the 2 cores: 10 s fired the watchdog while starting, not at the hang.
        "trainer.watchdog_s=20",
        "cluster.failure_grace_s=2",
        env={"HPC_TRAIN_FAULT": f"rank=1,step=3,kind={kind}"},
        timeout=150,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert elapsed < 90, f"took {elapsed:.0f}s"
    log0 = (run_dir / "logs" / "rank_0.log").read_text()
    assert "watchdog: no progress" in log0 and "most recent call first" in log0, log0[-2000:]
    assert "watchdog" in proc.stderr
    if kind == "hang":  # the sleeping rank's own watchdog dumps its stack too: the sleep is in it
        assert "faults.py" in (run_dir / "logs" / "rank_1.log").read_text()


def test_ctrl_c_checkpoints_and_the_rerun_resumes(tmp_path: Path) -> None:
    """SIGINT to the launcher (what Ctrl-C sends): the ranks checkpoint; the same command again finishes."""
    # status_every_s=1: the step is read from the statuses, which the node reports every 10 s by default; a
    # clean-clone run on an idle machine trained all 400 steps before the first report.
    job = [*JOB, "trainer.max_steps=400", "model.hidden_sizes=[512,512]", "cluster.status_every_s=1"]
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *job]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launcher = start_in_foreground(argv)
    deadline = time.monotonic() + 120
    while not RunDir(run_dir).read_statuses().get(0, {}).get("step"):
        assert time.monotonic() < deadline and launcher.poll() is None, "the run never reported a step"
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err[-3000:]
    stopped_at = {s["step"] for s in RunDir(run_dir).read_statuses().values()}
    assert len(stopped_at) == 1 and 0 < stopped_at.pop() < 400, err[-2000:]

    resumed = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [s for s, _ in losses(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 400  # each row once: the rerun redid none, lost none


def _processes_of(run_dir: Path) -> list[int]:
    """Processes whose command line names the run dir (the ranks: submitit's _submit with its folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if str(run_dir).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize(
    ("after_s", "to_launcher_only"), [(0.5, False), (1.5, False), (3.0, False), (6.0, False), (1.5, True), (3.0, True)]
)
def test_ctrl_c_at_any_moment_of_start_up_ends_the_run(tmp_path: Path, after_s: float, to_launcher_only: bool) -> None:
    """Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) while the launcher composes,
    while the ranks import torch, and around the first step: the run ends promptly, no rank is left behind, and
    where a step was done, every rank stopped at the same one with its checkpoint. SIGTERM to the launcher alone
    (kill, a CI runner's timeout) too: then only the launcher can tell the ranks, which may not be listening yet."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *JOB, "trainer.max_steps=4000"]
    launcher = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(after_s)
    if to_launcher_only:
        launcher.send_signal(signal.SIGTERM)
    else:
        os.killpg(launcher.pid, signal.SIGINT)
    start = time.monotonic()
    _, err = launcher.communicate(timeout=90)
    took = time.monotonic() - start
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert took < 45, f"the run took {took:.0f}s to end after Ctrl-C"
    time.sleep(0.5)
    assert not _processes_of(run_dir), "ranks were left behind"
    statuses = RunDir(run_dir).read_statuses() if run_dir.exists() else {}
    steps = {s.get("step") for s in statuses.values()}
    if statuses and {s["state"] for s in statuses.values()} == {"stopped"} and steps != {0}:
        assert len(steps) == 1, statuses
        assert (run_dir / "checkpoints" / f"step_{steps.pop():09d}.pt").is_file()
    else:
        assert "interrupted" in err, err[-2000:]
    if (run_dir / "config.yaml").is_file():  # the launch got that far: the run reads as stopped, never UNKNOWN
        status = subprocess.run(
            [sys.executable, "-m", "hpc_train.jobs", "status", "--json", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        (state,) = json.loads(status.stdout)
        assert state["state"] == "STOPPED", state


# A validation of 54,000 samples in batches of 4 (6,750 batches a rank): seconds long (4.7 s on an idle machine),
# against a step of milliseconds. Step 10's metrics row comes after its validation, so the test sees every rank at
# step 10 by their statuses, which reach status/ through the nodes' summaries: every second here (the default,
# 10 s, could fall after the validation on an idle machine), so that the signal lands in the validation.
VALIDATING = [
    "cluster.status_every_s=1",
    "trainer.max_steps=20",
    "trainer.max_epochs=0",
    "data.num_samples=60000",
    "data.val_fraction=0.9",
    "trainer.batch_size=4",
    "trainer.val_every_n_steps=10",
    "trainer.log_every_n_steps=5",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]


def test_a_stop_during_validation_is_heard_at_the_next_batch(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM to rank 0 in the middle of step 10's validation: the ranks agree on it before the next batch,
    skip the rest of the validation, save the checkpoint of step 10 (not 11: the stop does not wait for the
    validation to end), and say how soon it was durable. The resumed run skips that validation and ends with
    the uninterrupted run's weights."""
    base_dir = tmp_path / "baseline"
    # The baseline validates only at its last step: validation leaves the weights alone (the resumed run below,
    # which skips step 10's, must end bit-identical to it), and one long validation fewer is seconds of CPU.
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={base_dir}", *VALIDATING, "trainer.val_every_n_steps=20"]
    baseline = Background(argv, base_dir, tmp_path / "baseline.out", timeout=240)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *VALIDATING]
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    wait_for_ranks(run_dir, 10, alive=lambda: launcher.poll() is None)  # the heartbeat comes just before validation
    os.kill(int(RunDir(run_dir).read_statuses()[0]["pid"]), signal.SIGTERM)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err[-3000:]
    statuses = RunDir(run_dir).read_statuses()
    assert {s["state"] for s in statuses.values()} == {"stopped"} and {s["step"] for s in statuses.values()} == {10}
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")] == ["step_000000010.pt"]
    assert "validation at step 10 cut short by signal 15: skipped" in (run_dir / "logs" / "rank_0.log").read_text()
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert "train_loss" in rows[10] and "val_loss" not in rows[10], rows[10]
    assert 0 < statuses[0]["stop_saved_s"] < 60 and "stop_saved_s" not in statuses[1]  # rank 1 had no signal
    status = subprocess.run(
        [sys.executable, "-m", "hpc_train.jobs", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "STOPPED" in status.stdout and "checkpoint durable" in status.stdout, status.stdout + status.stderr

    resumed, _ = run_cli(*VALIDATING, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(baseline.ready(), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_loss" in r] == [20]  # step 10's validation was skipped, not redone


@pytest.mark.parametrize(
    ("fault", "stop"),
    [("rank=0,step=10,kind=termsave", 10), ("rank=1,step=1,kind=term", 1)],
    ids=["during a checkpoint", "during the first step"],
)
def test_a_stop_in_a_long_phase_is_served_at_its_end(run_cli, baseline: Background, fault: str, stop: int) -> None:  # type: ignore[no-untyped-def]
    """A signal while step 10's checkpoint is written stops the ranks as soon as it is durable: that checkpoint
    is the stop's, with no step after it (before: one more step and another checkpoint). A signal during the
    first step, which can be long (a compile), stops them right after it (before: a step later). The rerun
    ends bit-identical."""
    job = [*JOB, "trainer.checkpoint_every_n_steps=5"]
    stopped, run_dir = run_cli(*job, env={"HPC_TRAIN_FAULT": fault})
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    statuses = RunDir(run_dir).read_statuses()
    assert {s["step"] for s in statuses.values()} == {stop} and {s["state"] for s in statuses.values()} == {"stopped"}
    expected = [f"step_{s:09d}.pt" for s in range(5, stop + 1, 5)] or [f"step_{stop:09d}.pt"]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.pt")) == expected
    resumed, _ = run_cli(*job, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_bitwise_equal(baseline.ready(), run_dir)


def test_a_run_resumes_on_another_rank_count_with_the_same_samples(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Stopped mid-epoch on 2 ranks, resumed on 1 (accumulating 2 batches of 32), stopped in the next epoch,
    and finished on 2: every step trains on the samples of the uninterrupted run's step (the losses agree), and
    the weights end within float rounding of it (only the order of the sums differs; measured 2.2e-8; a batch
    replayed or skipped moves them by about 1e-2). Dropout is off: a rank's own random stream cannot carry over
    to another rank count."""
    job = [*JOB, "model.dropout=0"]
    base_dir = tmp_path / "baseline"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={base_dir}", *job]
    baseline = Background(argv, base_dir, tmp_path / "baseline.out", timeout=240)
    first, run_dir = run_cli(*job, env={"HPC_TRAIN_FAULT": "rank=1,step=13,kind=term"})
    assert first.returncode == 130, first.stderr[-3000:]
    one = ["cluster.tasks_per_node=1"]
    second, _ = run_cli(*job, *one, run_dir=run_dir, env={"HPC_TRAIN_FAULT": "rank=0,step=25,kind=term,attempt=1"})
    assert second.returncode == 130, second.stderr[-3000:]
    assert "global batch 64 = 32 a rank x 1 rank x 2 accumulated); it was trained on 1 node x 2 tasks" in second.stdout
    status = subprocess.run(
        [sys.executable, "-m", "hpc_train.jobs", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "resumed on 1 node x 1 task (global batch 64" in status.stdout, status.stdout + status.stderr
    third, _ = run_cli(*job, run_dir=run_dir)
    assert third.returncode == 0, third.stderr[-3000:]
    log = (run_dir / "logs" / "rank_0.restart2.log").read_text()
    assert "resumed from 1 node x 1 task (global batch 64 = 32 a rank x 1 rank x 2 accumulated) onto 1 node x 2" in log
    expected, got = losses(baseline.ready()), losses(run_dir)
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, expected, strict=True)) < 1e-5, (got, expected)
    final, reference = (torch.load(d / "model_final.pt", weights_only=True) for d in (run_dir, base_dir))
    difference = max((final[k] - reference[k]).abs().max().item() for k in reference)
    print(f"2 -> 1 -> 2 ranks: max |weight difference| from the uninterrupted run {difference:.2e}")
    assert difference < 1e-6
