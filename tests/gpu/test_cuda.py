"""The GPU path on a real GPU: nccl, device binding, mixed precision, memory figures, stop and exact resume.

Skipped where torch sees no GPU. One GPU is enough for every test here: NCCL refuses two ranks on one device
("Duplicate GPU detected"), so the nccl runs have one rank; the stop flag then still travels the gloo control
group that the trainer creates beside the nccl default group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir, read_json
from hpc_train.launch import write_config

from ..conftest import assert_bitwise_equal, gpu_test
from ..unit.test_config import composed

pytestmark = [pytest.mark.gpu, gpu_test]

ONE_GPU = ["cluster.gpus_per_node=1", "cluster.tasks_per_node=1", "cluster.cpus_per_task=4", "trainer.device=cuda"]
LEARNS = [
    "model=mlp",
    "model.hidden_sizes=[256,256]",
    "model.dropout=0.0",
    "optim=adamw",
    "optim.weight_decay=0.01",
    "trainer.lr=1e-3",
    "trainer.lr_scaling=none",
    "trainer.schedule.name=constant",
    "trainer.batch_size=64",
    "trainer.accumulate_grad_batches=1",
    "data.num_samples=4096",
    "data.class_separation=3.0",
    "data.num_classes=10",
    "data.input_shape=[784]",
    "data.seed=0",
    "trainer.seed=0",
]
"""What ``loss_fell`` relies on, pinned: these tests must not move with the defaults, which are tuned for the CPU
default run (trainer.lr moved from 1e-3 to 1e-4 for it, and 6 of these 10 tests then failed on an H200: loss
2.3008 -> 2.2769 in 40 steps). With lr 1e-3 the loss falls by far more than the 20% asked in 40 steps."""
SMALL = [
    *ONE_GPU,
    *LEARNS,
    "trainer.log_every_n_steps=5",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]


def ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def loss_fell(run_dir: Path, factor: float = 0.8) -> list[dict[str, float]]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "train_loss" in r]
    assert rows[-1]["train_loss"] < factor * rows[0]["train_loss"], [r["train_loss"] for r in rows]
    return rows


def test_one_rank_nccl_run_through_the_worker(run_cli) -> None:  # type: ignore[no-untyped-def]
    """`python -m hpc_train trainer.device=cuda`: nccl on cuda:0, GPU memory in metrics and status."""
    proc, run_dir = run_cli(*SMALL, "trainer.max_steps=40")
    ok(proc)
    (row,) = json.loads((run_dir / "rank_table.json").read_text())
    assert (row["device"], row["backend"]) == ("cuda:0", "nccl")
    assert "backend=nccl" in (run_dir / "logs" / "rank_0.log").read_text()
    rows = loss_fell(run_dir)
    assert all(r["cuda_max_mem_mb"] > 0 for r in rows)
    status = read_json(RunDir(run_dir).status_path(0))
    assert status["state"] == "completed" and status["cuda_max_mem_mb"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(run_cli, precision: str) -> None:  # type: ignore[no-untyped-def]
    """Autocast on CUDA; fp16 also scales the loss (a GradScaler whose state is checkpointed), bf16 does not."""
    proc, run_dir = run_cli(
        *SMALL, f"trainer.precision={precision}", "trainer.max_steps=40", "trainer.checkpoint_every_n_steps=20"
    )
    ok(proc)
    loss_fell(run_dir)
    state = torch.load(run_dir / "checkpoints" / "step_000000040.pt", weights_only=True)
    if precision == "fp16":
        assert state["scaler"]["scale"] > 1, state["scaler"]  # the scale fp16 needs, grown or backed off
    else:
        assert state["scaler"] == {}  # disabled: bf16 keeps fp32's exponent range
    weights = torch.load(run_dir / "model_final.pt", weights_only=True)
    assert all(w.dtype == torch.float32 for w in weights.values())  # autocast leaves the master weights in fp32


@pytest.mark.parametrize("strategy", ["dp", "single"])
def test_one_process_strategies(run_cli, strategy: str) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli(*SMALL, f"trainer.strategy={strategy}", "trainer.max_steps=60")
    ok(proc)
    loss_fell(run_dir)
    assert set(torch.load(run_dir / "model_final.pt", weights_only=True)) == {
        f"{i}.{p}" for i in (1, 3, 5) for p in ("weight", "bias")
    }  # DataParallel's "module." prefix does not leak into the saved weights


def test_compile_trains(run_cli) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli(*SMALL, "trainer.compile=true", "trainer.precision=bf16", "trainer.max_steps=40")
    ok(proc)
    loss_fell(run_dir)


def _slurm_task(rank: int, ntasks: int, run_dir: Path | None = None) -> dict[str, str]:
    """The variables srun gives task ``rank`` of a one-node step with --gpus-per-task=1: its own GPU only."""
    host = socket.gethostname()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        keep.pop(name, None)
    return keep | {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NODELIST": host,
        "SLURM_STEP_TASKS_PER_NODE": str(ntasks),
        "SLURMD_NODENAME": host,
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONUNBUFFERED": "1",
    }


def test_per_task_binding_gives_cuda_0() -> None:
    """Local rank 1 of 2 whose CUDA_VISIBLE_DEVICES holds only its own GPU trains on cuda:0, not cuda:1."""
    code = (
        "import torch\n"
        "from hpc_train.distributed import resolve_environment, select_device\n"
        "env = resolve_environment()\n"
        "device = select_device(env, use_cuda=True)\n"
        "x = torch.ones(4, device=device) * 2\n"
        "print(env.source, env.rank, env.local_rank, torch.cuda.device_count(), device, float(x.sum()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_slurm_task(1, 2), capture_output=True, text=True, timeout=120
    )
    ok(proc)
    assert proc.stdout.split() == ["slurm", "1", "1", "1", "cuda:0", "8.0"]


def test_worker_under_a_slurm_step_with_one_gpu(tmp_path: Path) -> None:
    """`srun python -m hpc_train.worker` as a one-task step with its GPU bound: the rank table says so."""
    run_dir = RunDir(tmp_path / "run")
    write_config(composed(*SMALL, "trainer.max_steps=10"), run_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.worker", "--run-dir", str(run_dir.path)],
        env=_slurm_task(0, 1),
        capture_output=True,
        text=True,
        timeout=180,
    )
    ok(proc)
    (row,) = json.loads(run_dir.rank_table.read_text())
    assert (row["source"], row["device"], row["backend"], row["cuda_visible_devices"]) == (
        "slurm",
        "cuda:0",
        "nccl",
        "0",
    )
    assert run_dir.model_final.is_file()


# 1260 training samples / 32 = 39 steps an epoch: 50 steps cross an epoch boundary, and step 13 is mid-epoch.
RESUME_JOB = [
    *ONE_GPU,
    "data.num_samples=1400",
    "trainer.batch_size=32",
    "trainer.max_steps=50",
    "trainer.max_epochs=0",
    "model.dropout=0.2",
    "trainer.log_every_n_steps=5",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stop_and_exact_resume_on_the_gpu(run_cli, tmp_path: Path, precision: str) -> None:  # type: ignore[no-untyped-def]
    """USR2 at step 13: the stop flag goes over the gloo control group beside nccl, every rank checkpoints
    (CUDA RNG included), and the rerun ends with the uninterrupted run's weights, bit for bit."""
    job = [*RESUME_JOB, f"trainer.precision={precision}"]
    base, base_dir = run_cli(*job, run_dir=tmp_path / "base")
    ok(base)
    stopped, run_dir = run_cli(*job, run_dir=tmp_path / "run", env={"HPC_TRAIN_FAULT": "rank=0,step=13,kind=usr2"})
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    stopped_status = read_json(RunDir(run_dir).status_path(0))
    assert stopped_status["state"] == "stopped" and stopped_status["cuda_max_mem_mb"] > 0
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")] == ["step_000000013.pt"]
    assert "cuda" in torch.load(run_dir / "checkpoints" / "step_000000013.pt", weights_only=True)["rng"][0]
    resumed, _ = run_cli(*job, run_dir=run_dir)
    ok(resumed)
    assert "resumed from" in (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert_bitwise_equal(base_dir, run_dir)
    assert [r["train_loss"] for r in read_metrics(run_dir / "metrics.jsonl")] == [
        r["train_loss"] for r in read_metrics(base_dir / "metrics.jsonl")
    ]


def test_a_background_snapshot_from_the_gpu_is_the_state_at_the_save(tmp_path: Path) -> None:
    """The snapshot's copies are queued on the training stream without a wait: in-place updates queued after
    the save do not reach the file, which holds what the synchronous save's holds (on the CPU)."""
    from hpc_train.train.checkpoint import Checkpoints
    from hpc_train.train.writer import CheckpointWriter

    from ..unit.test_writer import _state

    state = _state(3)  # a checkpoint's keys, as the CPU test of the same writer has them
    weight = state["model"]["w"] = torch.randn(2048, 2048, device="cuda")
    sync_run, async_run = RunDir(tmp_path / "sync"), RunDir(tmp_path / "async")
    CheckpointWriter(Checkpoints(sync_run), asynchronous=False).save(state, 3, keep=2)
    writer = CheckpointWriter(Checkpoints(async_run), asynchronous=True, pinned=True)
    writer.save(state, 3, keep=2)
    for _ in range(20):  # the next steps' updates, queued behind the copies
        weight.mul_(1.01).add_(1.0)
    writer.wait()
    assert writer.snapshot._buffers[0].is_pinned()
    saved = [torch.load(run.checkpoint(3), map_location="cpu", weights_only=True) for run in (sync_run, async_run)]
    assert torch.equal(saved[0]["model"]["w"], saved[1]["model"]["w"])
    assert not torch.equal(saved[1]["model"]["w"], weight.cpu())


def test_both_input_paths_give_the_same_run_on_the_gpu(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The synthetic set kept on the GPU (the default there) and the DataLoader's batches copied one ahead on a
    stream of their own (data.on_device=false) train the same weights, bit for bit, across an epoch boundary
    and its validation."""
    kept, kept_dir = run_cli(*RESUME_JOB, run_dir=tmp_path / "kept")
    ok(kept)
    fed, fed_dir = run_cli(*RESUME_JOB, "data.on_device=false", run_dir=tmp_path / "fed")
    ok(fed)
    assert "input: the training set kept on cuda:0" in (kept_dir / "logs" / "rank_0.log").read_text()
    assert "each batch copied to cuda:0 one step ahead" in (fed_dir / "logs" / "rank_0.log").read_text()
    assert_bitwise_equal(kept_dir, fed_dir)
    assert [r["train_loss"] for r in read_metrics(kept_dir / "metrics.jsonl")] == [
        r["train_loss"] for r in read_metrics(fed_dir / "metrics.jsonl")
    ]
