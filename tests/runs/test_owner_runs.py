"""One owner per run dir, with real local runs: a second launch is refused while the first trains, a finished run
is not started again, and a killed launcher takes its ranks with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import pid_alive

from ..conftest import wait_for_ranks

pytestmark = pytest.mark.slow

JOB = [
    "data.num_samples=2048",
    "model.hidden_sizes=[64]",
    "trainer.log_every_n_steps=5",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]


def start(run_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    """``python -m hpc_train`` in the background, its output in files (a pipe nobody reads would block it)."""
    out = (run_dir.parent / f"{run_dir.name}.out").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *JOB, *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground command
    )


def output(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.out").read_text()


def wait_for_step(launcher: subprocess.Popen[bytes], run_dir: Path, step: int, timeout: float = 120) -> None:
    """Every rank of the launcher's run reached ``step``; a launcher that ended fails the wait, with its output."""
    wait_for_ranks(
        run_dir, step, timeout, alive=lambda: launcher.poll() is None, explain=lambda: output(run_dir)[-3000:]
    )


def test_a_second_launch_into_a_live_run_dir_is_refused(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Review of issue 23: the second launch resumed from the first one's checkpoints while the first trained on;
    both wrote the same files, and the first one's later metrics rows were lost."""
    run_dir = tmp_path / "run"
    job = ["trainer.max_steps=1500", "trainer.checkpoint_every_n_steps=100"]
    first = start(run_dir, *job)
    try:
        wait_for_step(first, run_dir, 5)
        saved = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "overrides.json")}
        second, _ = run_cli(*JOB, *job, run_dir=run_dir)
        assert first.poll() is None, "the first run ended before the second launch was judged"
    finally:
        first.wait(timeout=300)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"hydra.run.dir={run_dir} is in use by the cluster=local launcher pid {first.pid} on " in second.stderr
    assert f"python -m hpc_train.jobs cancel {run_dir}" in second.stderr and "HINT:" in second.stderr
    assert first.returncode == 0, output(run_dir)[-3000:]
    assert {name: (run_dir / name).read_bytes() for name in saved} == saved
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "train_loss" in r]
    # Each row once, in order, every logged step there (epoch ends add rows of their own).
    assert steps == sorted(set(steps)) and set(range(5, 1501, 5)) <= set(steps) and steps[-1] == 1500, steps
    assert not (run_dir / "logs" / "rank_0.restart1.log").exists()  # no second attempt ever started
    assert not (run_dir / "owner.json").exists(), "the lease outlived the launch"


def test_a_finished_run_says_so_instead_of_starting_ranks(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first, run_dir = run_cli(*JOB, "trainer.max_steps=10")
    assert first.returncode == 0, first.stderr[-3000:]
    jobs_before = sorted((run_dir / "submitit").iterdir())
    again, _ = run_cli(*JOB, "trainer.max_steps=10", run_dir=run_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{run_dir} is finished at step 10 (trainer.max_steps=10); nothing to train" in again.stdout
    assert "HINT: raise trainer.max_steps" in again.stdout
    assert "local job" not in again.stdout  # no ranks were started
    assert sorted((run_dir / "submitit").iterdir()) == jobs_before
    assert not (run_dir / "logs" / "rank_0.restart1.log").exists()
    longer, _ = run_cli(*JOB, "trainer.max_steps=15", run_dir=run_dir)  # a larger max_steps trains on
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["step"] == 15


def test_ranks_end_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL to `python -m hpc_train` (cluster=local): its ranks used to train on, unsupervised. Now its watcher
    asks them to checkpoint and stop, then gives the run dir back."""
    run_dir = tmp_path / "run"
    launcher = start(run_dir, "trainer.max_steps=100000", "trainer.checkpoint_every_n_steps=100")
    try:
        wait_for_step(launcher, run_dir, 10)
    finally:
        launcher.kill()
        launcher.wait()
    killed = time.monotonic()
    ranks = [int(s["pid"]) for s in RunDir(run_dir).read_statuses().values()]
    assert len(ranks) == 2
    while any(pid_alive(pid) for pid in ranks):
        assert time.monotonic() - killed < 15, f"ranks still run 15s after the launcher was killed: {ranks}"
        time.sleep(0.1)
    took = time.monotonic() - killed
    statuses = RunDir(run_dir).read_statuses()
    assert {s["state"] for s in statuses.values()} == {"stopped"}, statuses
    (step,) = {s["step"] for s in statuses.values()}
    assert (run_dir / "checkpoints" / f"step_{step:09d}.pt").is_file()
    deadline = time.monotonic() + 10
    while (run_dir / "owner.json").exists():  # the watcher gives the lease back once the ranks are gone
        assert time.monotonic() < deadline, json.loads((run_dir / "owner.json").read_text())
        time.sleep(0.1)
    log = (run_dir / "submitit" / "controller.log").read_text()
    assert f"the launcher (pid {launcher.pid}) is gone" in log and "rank states: ['stopped']" in log, log
    print(f"ranks stopped {took:.1f}s after the launcher was killed, at step {step}")


def test_the_watcher_leaves_with_its_launcher(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A launch that ends normally leaves no watcher behind, and the same for Ctrl-C (SIGINT to the launcher)."""
    run_dir = tmp_path / "run"
    launcher = start(run_dir, "trainer.max_steps=100000")
    wait_for_step(launcher, run_dir, 5)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=120) == 130, output(run_dir)[-3000:]
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if str(run_dir).encode() in (entry / "cmdline").read_bytes():
                left.append(entry.name)
        except OSError:
            continue
    assert not left, f"processes of the run left behind: {left}"
    assert not (run_dir / "owner.json").exists()
