"""Resume on another shape, on the real testbed: a 2 x 2 job cancelled at about 40%, resumed on 1 node x 2,
cancelled again, and finished on 2 x 2. Which samples every rank read comes from a data set of the user's own
(written here into the folder the jobs are submitted from, as a user's repository would hold it)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir

from ..conftest import wait_for_ranks
from .conftest import Baseline, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

SAMPLES, STEPS_PER_EPOCH, RANK_BATCH = 2048, 32, 16
"""2048 samples in global batches of 64 (16 a rank on 2 x 2): 32 steps an epoch, every sample once."""

USER_DATA = '''
"""A data set that writes down, batch by batch, which samples each rank reads."""
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class Recorded(Dataset):
    def __init__(self, n, log_dir, delay_s=0.0):
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(4, (n,), generator=g)
        self.x = torch.randn(n, 32, generator=g) + self.y[:, None].float()
        self.log_dir, self.delay_s = Path(log_dir), delay_s

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        job = f"{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"  # a requeue: its own files
        name = f"job{job}.rank{os.environ['SLURM_PROCID']}.txt"
        with (self.log_dir / name).open("a") as f:
            f.write(" ".join(map(str, indices)) + "\\n")
        time.sleep(self.delay_s)  # a slower step, so that a cancel lands in the middle of the run
        return [self[i] for i in indices]
'''


def job(
    log_dir: Path, nodes: int, tasks_per_node: int = 2, delay_s: float = 0.04, steps: int = 3 * STEPS_PER_EPOCH
) -> list[str]:
    return [
        "cluster=slurm",
        "cluster.status_every_s=1",  # cancel_at acts on the step it reads from the ranks' statuses
        f"cluster.nodes={nodes}",
        f"cluster.tasks_per_node={tasks_per_node}",
        f"data.dataset={{_target_: elastic_data.Recorded, n: {SAMPLES}, log_dir: '{log_dir}', delay_s: {delay_s}}}",
        "data.input_shape=[32]",
        "data.num_classes=4",
        "model.hidden_sizes=[64]",
        "model.dropout=0",
        f"trainer.batch_size={RANK_BATCH}",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=0",
        "trainer.log_every_n_steps=1",
        "trainer.plots=false",
        "trainer.tensorboard=false",
        "trainer.progress_bar=false",
    ]


def cancel_at(run_dir: Path, job_id: str, step: int) -> int:
    """scancel the job once every rank has reached ``step``; the step every rank stopped at, with its checkpoint."""
    wait_for_ranks(run_dir, step)
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=120) == "CANCELLED"
    statuses = RunDir(run_dir).read_statuses().values()
    assert {s["state"] for s in statuses} == {"stopped"}, list(statuses)
    (stopped,) = {s["step"] for s in statuses}
    assert (run_dir / "checkpoints" / f"step_{stopped:09d}.pt").is_file()
    return int(stopped)


def trained_samples(
    log_dir: Path, attempts: list[tuple[str, int, int, int]], size: int = RANK_BATCH, restart: int = 0
) -> dict[int, list[int]]:
    """Step -> the samples its global batch trained on, over every attempt (job id, first step, last step,
    batches a step; ``size`` samples a rank reads at once, in Slurm's ``restart`` of the job). A rank reads the
    batches of its steps in order; reads of another size (the DDP warm-up batch of a resume) are not training,
    and a batch read after the last step (the stop) was not trained."""
    steps: dict[int, list[int]] = {}
    for job_id, first, last, accumulate in attempts:
        files = sorted(log_dir.glob(f"job{job_id}.{restart}.rank*.txt"))
        assert files, f"no samples recorded by job {job_id} (restart {restart})"
        for path in files:
            batches = [[int(i) for i in line.split()] for line in path.read_text().splitlines()]
            batches = [b for b in batches if len(b) == size][: (last - first) * accumulate]
            assert len(batches) == (last - first) * accumulate, f"{path}: {len(batches)} batches"
            for k, batch in enumerate(batches):
                steps.setdefault(first + 1 + k // accumulate, []).extend(batch)
    return {step: sorted(samples) for step, samples in steps.items()}


def test_a_job_resumed_on_half_the_nodes_and_back_sees_every_sample_once(tmp_path: Path) -> None:
    (tmp_path / "elastic_data.py").write_text(USER_DATA)
    base_log, log = tmp_path / "ids-baseline", tmp_path / "ids"
    base_log.mkdir()
    log.mkdir()
    baseline = Baseline(submit_job(tmp_path / "baseline", *job(base_log, 2)), tmp_path / "baseline")
    run_dir = tmp_path / "run"

    first_job = submit_job(run_dir, *job(log, 2))
    first = cancel_at(run_dir, first_job, int(0.4 * 3 * STEPS_PER_EPOCH))
    second_job = submit_job(run_dir, *job(log, 1))
    second = cancel_at(run_dir, second_job, first + 25)
    third_job = submit_job(run_dir, *job(log, 2))
    assert wait_for_job(third_job, timeout=300) == "COMPLETED"
    print(f"2 x 2 cancelled at step {first}, 1 x 2 cancelled at step {second}, 2 x 2 to step {3 * STEPS_PER_EPOCH}")

    status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert "resumed on 2 nodes x 2 tasks (global batch 64" in status, status
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("rank_0*.log"))
    for was, onto in (("2 nodes x 2 tasks", "1 node x 2 tasks"), ("1 node x 2 tasks", "2 nodes x 2 tasks")):
        assert f"resumed from {was} (global batch 64" in logs and f"onto {onto} (global batch 64" in logs

    # Every step trained on the samples of the uninterrupted job's step, over three jobs and two shapes, and
    # every epoch on each sample exactly once.
    attempts = [
        (first_job, 0, first, 1),
        (second_job, first, second, 2),  # 1 x 2 keeps the batch of 16 a rank and accumulates 2
        (third_job, second, 3 * STEPS_PER_EPOCH, 1),
    ]
    steps = trained_samples(log, attempts)
    assert steps == trained_samples(base_log, [(baseline.job_id, 0, 3 * STEPS_PER_EPOCH, 1)])
    for epoch in range(3):
        samples = [i for s in range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1) for i in steps[s]]
        twice = [i for i, n in Counter(samples).items() if n > 1]
        assert not twice and sorted(samples) == list(range(SAMPLES)), (epoch, twice[:10], len(samples))

    base_dir = baseline.ready()
    expected, got = (
        [(r["step"], r["train_loss"]) for r in read_metrics(d / "metrics.jsonl") if "train_loss" in r]
        for d in (base_dir, run_dir)
    )
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, expected, strict=True)) < 1e-5
    final, ref = (torch.load(d / "model_final.pt", weights_only=True) for d in (run_dir, base_dir))
    difference = max((final[k] - ref[k]).abs().max().item() for k in ref)
    print(f"2x2 -> 1x2 -> 2x2 on Slurm: max |weight difference| from the uninterrupted job {difference:.2e}")
    assert difference < 1e-6
