"""A user's own torchrun loop under hpc_train: stop together on a signal, resume from its own save, end exact.

Real local runs of hpc_train/examples/preemptible_loop.py on 2 ranks. The Slurm requeue of the same script, with
should_stop and with no integration at all, is in tests/integration/test_script_slurm.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_train.core.rundir import RunDir

from ..conftest import REPO, Background, start_in_foreground, wait_for_step

LOOP = REPO / "hpc_train" / "examples" / "preemptible_loop.py"

pytestmark = pytest.mark.slow


def command(run_dir: Path, out: Path, *extra: str) -> list[str]:
    args = ",".join(["--out", str(out), "--steps", "120", *extra])
    return [
        sys.executable,
        "-m",
        "hpc_train",
        f"hydra.run.dir={run_dir}",
        f"script.path={LOOP}",
        f"script.args=[{args}]",
    ]


def interrupted(run_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Start the run, Ctrl-C the launcher once the loop has made a few steps, wait for it to end."""
    out.mkdir(exist_ok=True)
    launcher = start_in_foreground(command(run_dir, out, *extra))
    wait_for_step(out, 1, 50, timeout=120, alive=lambda: launcher.poll() is None)  # of its 120 steps
    launcher.send_signal(signal.SIGINT)
    out_text, err = launcher.communicate(timeout=120)
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out_text, err)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Background:
    """The uninterrupted run, beside the interrupted one (which is stopped at a step it has reached)."""
    root = tmp_path_factory.mktemp("baseline")
    (root / "out").mkdir()
    return Background(command(root / "run", root / "out"), root / "out" / "final.pt", root / "launcher.out")


def test_stopped_script_resumes_from_its_own_save(tmp_path: Path, baseline: Background) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    stopped = interrupted(run_dir, out)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    statuses = RunDir(run_dir).read_statuses()
    assert {s["state"] for s in statuses.values()} == {"stopped"}, statuses
    # the stop's cost, as growth weighs it: from the signal passed on to the script's exit after its save
    assert 0 < statuses[0]["stop_saved_s"] < 60, statuses
    # Both ranks agreed on one step, saved there and said so; that is where the rerun starts.
    progress = [RunDir(run_dir).read_progress(rank) for rank in (0, 1)]
    assert {p["stop_agreed"] for p in progress} == {True} and len({p["step"] for p in progress}) == 1, progress
    saved = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    assert saved == progress[0]["step"] and 0 < saved < 120

    resumed = subprocess.run(command(run_dir, out), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    starts = [int(s) for s in (out / "starts.txt").read_text().split()]
    assert starts[0] == 0 and starts[1] > 0, starts
    assert (RunDir(run_dir).logs / "rank_0.restart1.log").exists()  # the second attempt's logs are its own
    # Each rank's start-up, as far as hpc_train sees a script: its own phases, then the script to its first step.
    profiles = RunDir(run_dir).startup_profiles()
    assert sorted(profiles) == [0, 1], profiles
    assert all(p.script_s and p.resolve_s is not None and p.model_s is None for p in profiles.values()), profiles
    assert "script " in (RunDir(run_dir).logs / "rank_1.restart1.log").read_text()
    final, expected = (torch.load(p, weights_only=True) for p in (out / "final.pt", baseline.ready()))
    assert all(torch.equal(final[k], expected[k]) for k in expected), "the resumed run's weights differ"
