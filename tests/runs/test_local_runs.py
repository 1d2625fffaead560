"""Real multi-process runs through `python -m hpc_train` (gloo on CPU): what a user sees, end to end."""

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

from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config

from ..unit.test_config import composed

pytestmark = pytest.mark.slow

SMALL = ["data.num_samples=2048", "model.hidden_sizes=[64]", "trainer.log_every_n_steps=5"]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "model_final.pt", weights_only=True)
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    return state


def test_default_job(run_cli) -> None:  # type: ignore[no-untyped-def]
    """README's first command: the default config, a 2-rank DDP run on CPU."""
    proc, run_dir = run_cli()
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("config.yaml", "metrics.jsonl", "model_final.pt", "logs/rank_0.log", "logs/rank_1.log"):
        assert (run_dir / name).is_file(), name
    assert "rank table (attempt 0, 2 ranks)" in proc.stderr
    for rank in (0, 1):
        log = (run_dir / f"logs/rank_{rank}.log").read_text()
        assert "rank resolution: source=submitit-local (SUBMITIT_LOCAL_GLOBALID is set)" in log
    table = json.loads((run_dir / "rank_table.json").read_text())
    assert [row["rank"] for row in table] == [0, 1]
    assert len({row["master"] for row in table}) == 1
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert {"step", "epoch", "train_loss", "lr", "samples_per_s"} <= rows[0].keys()
    assert rows[-1]["train_loss"] < 0.8 * rows[0]["train_loss"], "loss did not fall"
    final = rows[-1]
    assert final["val_samples"] == 3276 and final["val_acc"] > 0.7
    assert weights(run_dir)


def test_two_ranks_equal_one_rank_with_twice_the_batch(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """DistributedSampler shards make 2 ranks x B the same global batch as 1 rank x 2B."""
    common = [*SMALL, "trainer.max_steps=25", "data.val_fraction=0.1", "trainer.val_every_n_steps=10"]
    two, two_dir = run_cli(*common, "cluster.tasks_per_node=2", "trainer.batch_size=16", run_dir=tmp_path / "two")
    one, one_dir = run_cli(*common, "cluster.tasks_per_node=1", "trainer.batch_size=32", run_dir=tmp_path / "one")
    assert two.returncode == 0, two.stderr[-3000:]
    assert one.returncode == 0, one.stderr[-3000:]
    w2, w1 = weights(two_dir), weights(one_dir)
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-4, atol=1e-5)
    # Exact validation: 204 samples over 2 ranks, none counted twice; same metrics as the 1-rank run.
    val2 = [r for r in read_metrics(two_dir / "metrics.jsonl") if "val_loss" in r]
    val1 = [r for r in read_metrics(one_dir / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in val2] == [r["step"] for r in val1] == [10, 20, 25]
    for a, b in zip(val2, val1, strict=True):
        assert a["val_samples"] == b["val_samples"] == 204
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
        assert a["val_acc"] == pytest.approx(b["val_acc"], abs=1e-9)


def test_identical_runs_are_bitwise_identical(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = [*SMALL, "trainer.max_steps=20", "model.dropout=0.1"]
    a, a_dir = run_cli(*args, run_dir=tmp_path / "a")
    b, b_dir = run_cli(*args, run_dir=tmp_path / "b")
    assert a.returncode == b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    wa, wb = weights(a_dir), weights(b_dir)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c, c_dir = run_cli(*args, "trainer.seed=1", run_dir=tmp_path / "c")
    assert c.returncode == 0
    assert not all(torch.equal(wa[k], weights(c_dir)[k]) for k in wa), "the seed has no effect"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("rank=1,step=3,kind=raise", "injected fault (HPC_TRAIN_FAULT) on rank 1 at step 3"),
        ("rank=1,step=3,kind=kill", "exited without reporting"),
        # Before the rendezvous: rank 0 would wait in init_process_group for the whole dist timeout.
        ("rank=1,step=0,kind=raise", "injected fault (HPC_TRAIN_FAULT) on rank 1 at step 0"),
    ],
)
def test_failing_rank_ends_the_job_and_is_named(run_cli, fault: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    proc, run_dir = run_cli(
        *SMALL, "trainer.max_steps=400", "cluster.failure_grace_s=5", env={"HPC_TRAIN_FAULT": fault}
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "job FAILED" in proc.stderr
    assert "rank 1 on" in proc.stderr and "failed first" in proc.stderr
    assert expected in proc.stderr
    assert not (run_dir / "model_final.pt").exists()
    assert elapsed < 60, f"took {elapsed:.0f}s to end a job with a dead rank"


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of a local job's rank, found by the variables submitit gives it (it may not have a status yet)."""
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SUBMITIT_LOCAL_GLOBALID={rank}".encode() in environ and any(str(run_dir).encode() in v for v in environ):
            return int(entry.name)
    return None


def test_a_rank_killed_before_its_first_status_ends_the_job(tmp_path: Path) -> None:
    """A rank that dies while it still imports torch writes no status. Its peer waits for it in the rendezvous,
    so the launcher must see the process gone (it waited out the rendezvous timeout, minutes, before)."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *SMALL, "cluster.failure_grace_s=2"]
    start = time.monotonic()
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    while pid is None and time.monotonic() - start < 60:
        pid = _rank_pid(run_dir, 0)
        time.sleep(0.02)
    assert pid is not None and not (run_dir / "status" / "rank_0.json").exists()
    os.kill(pid, signal.SIGKILL)
    _, err = launcher.communicate(timeout=150)
    took = time.monotonic() - start
    assert launcher.returncode == 1 and "job FAILED" in err, err[-3000:]
    assert "ranks that never started: [0]" in err, err[-3000:]
    assert took < 60, f"took {took:.0f}s to end a job whose rank 0 died before its first status"


def test_debug_launcher_runs_in_process(run_cli) -> None:  # type: ignore[no-untyped-def]
    ckpt = ["trainer.checkpoint_every_n_steps=1", "trainer.keep_checkpoints=2"]
    proc, run_dir = run_cli(*SMALL, "cluster=debug", "trainer.max_steps=5", *ckpt)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000000004.pt", "step_000000005.pt"]
    last = torch.load(run_dir / "checkpoints/step_000000005.pt", weights_only=True)
    assert last["step"] == 5 and last["config"]["cluster"]["launcher"] == "debug"
    assert all(torch.equal(last["model"][k], v) for k, v in weights(run_dir).items())
    table = json.loads((run_dir / "rank_table.json").read_text())
    assert len(table) == 1 and table[0]["source"] == "single"
    assert weights(run_dir)


def test_config_error_stops_before_launch(run_cli) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli("trainer.batch_size=0")
    assert proc.returncode == 2
    assert "trainer.batch_size=0 is invalid" in proc.stderr and "HINT:" in proc.stderr
    assert not (run_dir / "submitit").exists()
    proc, _ = run_cli("trainer.batch_sise=3")
    assert proc.returncode == 2 and "did you mean trainer.batch_size" in proc.stderr


def test_worker_under_torchrun(tmp_path: Path) -> None:
    """`torchrun -m hpc_train.worker --run-dir DIR`: ranks come from torchrun's variables."""
    run_dir = RunDir(tmp_path / "tr")
    write_config(composed(*SMALL, "trainer.max_steps=5"), run_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = subprocess.run(
        [*cmd, "-m", "hpc_train.worker", "--run-dir", str(run_dir.path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(run_dir.rank_table.read_text())
    assert [(r["rank"], r["source"]) for r in table] == [(0, "torchrun"), (1, "torchrun")]
    assert run_dir.model_final.is_file()


def test_local_sweep_runs_one_job_after_another(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    args = [*SMALL, "trainer.max_steps=3", "trainer.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train", "-m", *args], capture_output=True, text=True, cwd=tmp_path, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lrs = [composed_lr(sweep_dir / str(i)) for i in range(2)]
    assert lrs == [1e-3, 2e-3]
    assert all((sweep_dir / str(i) / "model_final.pt").is_file() for i in range(2))


def composed_lr(run_dir: Path) -> float:
    from hpc_train.config import load_config

    return load_config(run_dir / "config.yaml").trainer.lr


def test_train_longer_in_the_same_run_dir_and_start_from_its_weights(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Raising trainer.max_steps goes on from the run's last checkpoint; a key that changes what was trained is
    refused by name; trainer.init_from starts a new run from the weights."""
    job = [*SMALL, "trainer.progress_bar=false", "trainer.plots=false", "trainer.tensorboard=false"]
    first, run_dir = run_cli(*job, "trainer.max_steps=10")
    assert first.returncode == 0, first.stderr[-2000:]
    longer, _ = run_cli(*job, "trainer.max_steps=20", run_dir=run_dir)
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert "resuming" in longer.stdout and "trainer.max_steps" in longer.stdout
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if "train_loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 20 and steps[0] == 5, steps  # 5, 10 from the first run
    refused, _ = run_cli(*job, "trainer.max_steps=20", "trainer.lr=0.1", run_dir=run_dir)
    assert refused.returncode == 2
    assert "trainer.lr: 0.0001 -> 0.1" in refused.stderr and "trainer.init_from=" in refused.stderr, refused.stderr

    fresh, new_dir = run_cli(*job, "trainer.max_steps=5", f"trainer.init_from={run_dir}", run_dir=tmp_path / "new")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert f"initialised the model from {run_dir / 'model_final.pt'}" in (new_dir / "logs" / "rank_0.log").read_text()
    first_loss = read_metrics(run_dir / "metrics.jsonl")[0]["train_loss"]
    assert read_metrics(new_dir / "metrics.jsonl")[0]["train_loss"] < first_loss  # it starts where the first ended
    missing, _ = run_cli(*job, "trainer.init_from=nowhere", run_dir=tmp_path / "bad")
    assert missing.returncode == 2 and "trainer.init_from='nowhere': no such file or run dir" in missing.stderr


def test_an_early_stopped_run_run_again_stays_stopped(run_cli) -> None:  # type: ignore[no-untyped-def]
    """The same command again on an early-stopped run dir resumes at its end and trains no further."""
    job = [*SMALL, "trainer.progress_bar=false", "trainer.plots=false", "trainer.tensorboard=false"]
    job += ["trainer.max_steps=2000", "trainer.val_every_n_steps=5", "trainer.early_stopping.patience=1"]
    job += ["trainer.early_stopping.min_delta=10"]  # no validation can improve by 10: stops at the second one
    first, run_dir = run_cli(*job)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    again, _ = run_cli(*job, run_dir=run_dir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_metrics(run_dir / "metrics.jsonl") == rows, "the rerun trained past the early stop"
