"""A torchrun loop that keeps its global batch (hpc_train/examples/global_batch_loop.py, ``script.global_batch``):
stopped on 2 ranks and resumed by hand on 1, it trains every step on the samples of an uninterrupted 2-rank run,
each step once, and ends with its weights to rounding; so does the Hugging Face example, whose accumulation the
callback sets; a script that says it keeps one but does not ask ends at its first step, not retried. The node range, the requeue on fewer nodes and the growth run on the testbed
(tests/integration/test_global_batch_slurm.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hpc_train.core.rundir import RunDir

from ..conftest import REPO, Background, needs, start_in_foreground, wait_for_step

pytestmark = pytest.mark.slow

STEPS, BATCH = 60, 16
"""60 steps of a global batch of 16 (8 a rank on 2 ranks; 8 x 2 accumulated on 1)."""
TOLERANCE = 1e-5
"""The weights of the run stopped on 2 ranks and finished on 1 against the uninterrupted 2-rank run: the same
samples every step, their gradients summed in another order (2 ranks' (a + b) / 2 against one rank's a / 2 +
b / 2). Measured: 0 for the loop and the Hugging Face example, since halving is exact in binary floating point;
8.9e-08 for the Lightning example (its loss scaling and DDP's averaging round in another order); other rank
counts agree to rounding. A
batch trained twice or left out moves this loop's weights by far more: 0.28 and 0.27 (step 25 replayed or
skipped in 60, computed in one process with the same sampler)."""


LOOP = "script.module=hpc_train.examples.global_batch_loop"


def command(run_dir: Path, out: Path, ranks: int, script: str = LOOP, args: str = "") -> list[str]:
    """A local run of ``script`` on ``ranks`` ranks with script.global_batch=BATCH; ``args``: the script's (by
    default the example loop's: STEPS steps, 8 a rank, its sample logs in ``out``)."""
    args = args or f"--out,{out},--steps,{STEPS},--samples,{out},--per-rank,8"
    return [
        sys.executable,
        "-m",
        "hpc_train",
        f"hydra.run.dir={run_dir}",
        script,
        f"script.args=[{args}]",
        f"script.global_batch={BATCH}",
        "cluster=local",
        f"cluster.tasks_per_node={ranks}",
    ]


def trained(out: Path) -> dict[int, list[int]]:
    """Step -> the samples its global batch trained on, from every rank's log of every attempt; a step that
    appears in two attempts' logs was trained twice, and fails the test."""
    steps: dict[int, list[int]] = defaultdict(list)
    attempts: dict[int, set[str]] = defaultdict(set)
    for log in sorted(out.glob("attempt*.rank*.txt")):
        for line in log.read_text().splitlines():
            step, *samples = (int(w) for w in line.split())
            steps[step].extend(samples)
            attempts[step].add(log.name.split(".")[0])
    twice = {step: names for step, names in attempts.items() if len(names) > 1}
    assert not twice, f"steps trained in two attempts: {twice}"
    return {step: sorted(samples) for step, samples in steps.items()}


def stopped_at_step(argv: list[str], out: Path, step: int, timeout: float) -> None:
    """Start the run, Ctrl-C its launcher once rank 0 has reached ``step`` (``timeout`` at most), and wait for the
    ranks to stop."""
    launcher = start_in_foreground(argv)
    wait_for_step(out, 1, step, timeout=timeout, alive=lambda: launcher.poll() is None)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 130, err[-3000:]


Command = Callable[[Path, Path, int], list[str]]
"""A run's command line from its run dir, its output folder and its rank count."""


def with_baseline(tmp_path: Path, make: Command) -> tuple[Background, Path, Path]:
    """The uninterrupted 2-rank run of ``make``'s command, started in the background (its outputs in
    ``tmp_path/baseline``), and the run dir and output folder of the run to compare with it."""
    base = tmp_path / "baseline"
    base.mkdir()
    baseline = Background(make(tmp_path / "base-run", base, 2), base / "final.pt", tmp_path / "baseline.log")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    return baseline, run_dir, out


def baseline_and_stopped(tmp_path: Path, make: Command, timeout: float) -> tuple[Background, Path, Path]:
    """``with_baseline``, and the run stopped on 2 ranks at step 20 or a little after."""
    baseline, run_dir, out = with_baseline(tmp_path, make)
    stopped_at_step(make(run_dir, out, 2), out, 20, timeout=timeout)
    return baseline, run_dir, out


def weights_apart(final: Path, expected: Path) -> float:
    """The largest difference between two saved state dicts, tensor by tensor."""
    a, b = (torch.load(p, weights_only=True) for p in (final, expected))
    return max((a[k] - b[k]).abs().max().item() for k in b)


def test_a_scripts_run_stopped_on_two_ranks_ends_on_one_with_the_same_samples_every_step(tmp_path: Path) -> None:
    baseline, run_dir, out = baseline_and_stopped(tmp_path, command, timeout=180)
    base = tmp_path / "baseline"
    stopped = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    assert 20 <= stopped < STEPS

    resumed = subprocess.run(command(run_dir, out, 1), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} on 1 node x 1 task" in resumed.stdout, resumed.stdout[-2000:]
    [reshape] = RunDir(run_dir).reshape_records()
    assert reshape.was.startswith("1 node x 2 tasks (global batch 16") and "1 rank" in reshape.onto, reshape
    assert (out / "ranks.txt").read_text().split() == ["2", "1"]
    assert (out / "starts.txt").read_text().split() == ["0", str(stopped)]
    said = (RunDir(run_dir).logs / "rank_0.restart1.log").read_text()
    assert f"step {stopped}: global batch 16 = 8 a rank x 1 rank x 2 accumulated" in said, said[-2000:]

    assert trained(out) == trained(base) and sorted(trained(out)) == list(range(1, STEPS + 1))
    worst = weights_apart(out / "final.pt", baseline.ready())
    assert worst <= TOLERANCE, f"the weights differ by {worst:.2e} from the uninterrupted run's"
    print(f"stopped at step {stopped} of {STEPS} on 2 ranks, finished on 1: weights within {worst:.1e}")


def test_a_script_that_says_it_keeps_a_global_batch_but_does_not_ask_ends_at_its_first_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    loop = REPO / "hpc_train" / "examples" / "preemptible_loop.py"
    argv = command(tmp_path / "run", out, 2, script=f"script.path={loop}", args=f"--out,{out}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "script.global_batch=16 says this script keeps that global batch" in said, said[-3000:]
    assert "HINT: build the DataLoader from GlobalBatch.of" in said
    assert (out / "starts.txt").read_text().split() == ["0"], "retried: a config error is not a failure to retry"
    assert not (out / "final.pt").exists()


def read_batches(out: Path, attempts: list[tuple[int, int, int]], ranks: list[int]) -> dict[int, list[int]]:
    """Step -> its samples, from the per-rank batch logs of a script that cannot say which step a batch is for
    (the Hugging Face example): ``attempts`` as (first step done before it, last step, accumulation), ``ranks``
    each attempt's rank count. A rank reads its steps' batches in order; what it read after its last step (a
    loader reads one batch ahead) was not trained."""
    steps: dict[int, list[int]] = defaultdict(list)
    for number, ((first, last, accumulate), world) in enumerate(zip(attempts, ranks, strict=True)):
        for rank in range(world):
            lines = (out / f"attempt{number}.rank{rank}.txt").read_text().splitlines()
            assert len(lines) >= (last - first) * accumulate, f"attempt {number} rank {rank}: {len(lines)} batches"
            for k, line in enumerate(lines[: (last - first) * accumulate]):
                steps[first + 1 + k // accumulate].extend(int(w) for w in line.split())
    return {step: sorted(samples) for step, samples in steps.items()}


def hf_command(run_dir: Path, out: Path, ranks: int) -> list[str]:
    hf_args = f"--out,{out},--steps,{STEPS},--samples,{out},--sleep,0.02"
    return command(run_dir, out, ranks, script="script.module=hpc_train.examples.hf_trainer", args=hf_args)


@needs("transformers", "accelerate")
def test_a_hugging_face_run_stopped_on_two_ranks_ends_on_one_with_the_same_samples_every_step(tmp_path: Path) -> None:
    """The Hugging Face example (8 a device, script.global_batch=16): the callback sets the Trainer's accumulation
    to 2 on one rank; the Trainer's own sampler and accelerate's sharding keep the order, and its resume skips
    the steps done."""
    baseline, run_dir, out = baseline_and_stopped(tmp_path, hf_command, timeout=240)
    base = tmp_path / "baseline"
    stopped = _stopped_at(out)
    resumed = subprocess.run(hf_command(run_dir, out, 1), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "hpc_train: global batch 16 = 8 a rank x 1 rank x 2 accumulated (gradient_accumulation_steps 1 -> 2)" in (
        resumed.stdout + (RunDir(run_dir).logs / "rank_0.restart1.log").read_text()
    )
    assert (out / "starts.txt").read_text().split() == ["0", str(stopped)]

    steps = read_batches(out, [(0, stopped, 1), (stopped, STEPS, 2)], [2, 1])
    assert sorted(steps) == list(range(1, STEPS + 1)) and all(len(s) == BATCH for s in steps.values())
    assert steps == read_batches(base, [(0, STEPS, 1)], [2])
    worst = weights_apart(out / "final.pt", baseline.ready())
    assert worst <= TOLERANCE, f"the weights differ by {worst:.2e} from the uninterrupted run's"
    print(f"Hugging Face: stopped at step {stopped} of {STEPS} on 2 ranks, finished on 1: weights within {worst:.1e}")


def hf_keep_command(run_dir: Path, out: Path, ranks: int, keep: bool = True) -> list[str]:
    """The Hugging Face example with a global batch of 24 and 8 a device (240 samples: 10 steps an epoch);
    ``keep``: it calls keep_global_batch before building the Trainer."""
    hf_args = f"--out,{out},--steps,{STEPS},--samples,{out},--sleep,0.02,--data,240" + (",--keep-batch" if keep else "")
    argv = command(run_dir, out, ranks, script="script.module=hpc_train.examples.hf_trainer", args=hf_args)
    return [("script.global_batch=24" if a.startswith("script.global_batch=") else a) for a in argv]


@needs("transformers", "accelerate")
def test_a_hugging_face_per_device_batch_that_does_not_divide_is_set_by_keep_global_batch(tmp_path: Path) -> None:
    """A global batch of 24 with 8 a device: on 2 ranks a rank's share is 12, which 8 does not divide, and the
    Trainer fixes its loader's batch in its constructor. Built without keep_global_batch, the callback ends the
    script with the key and both fixes; with it, 6 a device x 2 accumulated on 2 ranks, then 8 x 3 on 1 after a
    stop: every step on the uninterrupted 2-rank run's samples, once."""
    refused = subprocess.run(
        hf_keep_command(tmp_path / "refused", tmp_path / "refused-out", 2, keep=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "12 samples a rank a step, which per_device_train_batch_size=8" in said, said[
        -3000:
    ]
    assert "call hpc_train.integrations.transformers.keep_global_batch(args) before building the Trainer" in said

    baseline, run_dir, out = baseline_and_stopped(tmp_path, hf_keep_command, timeout=240)
    base = tmp_path / "baseline"
    stopped = _stopped_at(out)
    first = (RunDir(run_dir).logs / "rank_0.log").read_text()
    told = "global batch 24 = 6 a rank x 2 ranks x 2 accumulated (per_device_train_batch_size 8 -> 6, gradient_accumulation_steps 1 -> 2)"
    assert first.count(told) == 1, first[-3000:]  # said once: the callback does not say it again
    resumed = subprocess.run(hf_keep_command(run_dir, out, 1), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "global batch 24 = 8 a rank x 1 rank x 3 accumulated (per_device_train_batch_size 8 -> 8" in (
        resumed.stdout + (RunDir(run_dir).logs / "rank_0.restart1.log").read_text()
    )
    steps = read_batches(out, [(0, stopped, 2), (stopped, STEPS, 3)], [2, 1])
    assert sorted(steps) == list(range(1, STEPS + 1)) and all(len(s) == 24 for s in steps.values())
    assert steps == read_batches(base, [(0, STEPS, 2)], [2])
    worst = weights_apart(out / "final.pt", baseline.ready())
    assert worst <= TOLERANCE, f"the weights differ by {worst:.2e} from the uninterrupted run's"
    print(f"Hugging Face, 6 a device on 2 ranks then 8 on 1: stopped at {stopped}, weights within {worst:.1e}")


def _stopped_at(out: Path) -> int:
    """The step of the Trainer's stop checkpoint (checkpoint-<step>, marked complete by the callback)."""
    (folder,) = (out / "checkpoints").glob("checkpoint-*")
    return int(folder.name.split("-")[1])


def lightning_command(
    run_dir: Path, out: Path, ranks: int, signal_at: tuple[int, ...] = (), extra: str = ""
) -> list[str]:
    signals = "".join(f",--signal-at,{step}" for step in signal_at)
    args = f"--out,{out},--steps,{STEPS},--samples,{out},--sleep,0.02{signals}{extra}"
    return command(run_dir, out, ranks, script="script.module=hpc_train.examples.lightning_script", args=args)


@needs("lightning", "torchdata")
def test_a_lightning_run_stopped_on_two_ranks_ends_on_one_with_the_same_samples_every_step(tmp_path: Path) -> None:
    """The Lightning example (8 a rank, a seeded DistributedSampler, a StatefulDataLoader, script.global_batch=16,
    16 steps an epoch): stopped on 2 ranks at step 20, resumed on 1, stopped again at 26 in the same epoch and
    finished on 1. On one rank the callback sets accumulate_grad_batches to 2; the first resume sets the loader's
    2-rank state aside and skips the epoch's trained batches in the sampler, rescaled to the new accumulation;
    the second skips again, since the loader's own state then counts from the skip."""
    baseline, run_dir, out = with_baseline(tmp_path, lightning_command)
    base = tmp_path / "baseline"
    for ranks in (2, 1, 1):
        done = subprocess.run(
            lightning_command(run_dir, out, ranks, signal_at=(20, 26)), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
    starts = [0, *sorted(int(p.stem.split("_")[-1]) for p in out.glob("hpc_ckpt_*.ckpt"))]  # the two stops
    assert 20 <= starts[1] < 26 <= starts[2] < 32, f"the stops were at {starts[1:]}, not both in epoch 2 (17-32)"
    said = (RunDir(run_dir).logs / "rank_0.restart1.log").read_text()
    assert "hpc_train: global batch 16 = 8 a rank x 1 rank x 2 accumulated (accumulate_grad_batches 1 -> 2)" in said
    assert "written by 2 ranks and 1 resume it, with the same global batch and data order" in said, said[-3000:]
    assert (out / "starts.txt").read_text().split() == [str(s) for s in starts]
    assert (out / "ranks.txt").read_text().split() == ["2", "1", "1"]

    assert trained(out) == trained(base) and sorted(trained(out)) == list(range(1, STEPS + 1))
    worst = weights_apart(out / "final.pt", baseline.ready())
    assert worst <= TOLERANCE, f"the weights differ by {worst:.2e} from the uninterrupted run's"
    print(f"Lightning: stopped at steps {starts[1:]} of {STEPS}, on 2 ranks then 1, finished on 1: within {worst:.1e}")


@needs("lightning", "torchdata")
def test_a_lightning_run_that_crashed_on_two_ranks_resumes_on_one_from_lightnings_own_checkpoint(
    tmp_path: Path,
) -> None:
    """A lost node's case: no stop checkpoint, only Lightning's own ModelCheckpoint (every 10 steps), written on
    2 ranks; rank 0 raises at step 25 and the run ends (cluster.slurm.max_failures=0). Resumed by hand on 1 rank
    from step 20: the callback's state in that checkpoint says its shape, so the epoch's counts are rescaled to
    the accumulation of 2 and its trained batches skipped, the loader's 2-rank state set aside. Steps 21-25 are
    trained again, as after any crash, on the samples they had."""
    baseline, run_dir, out = with_baseline(tmp_path, lightning_command)
    base = tmp_path / "baseline"

    def crashing(ranks: int) -> list[str]:  # (--fail-at: the first attempt only)
        extra = ",--save-every,10,--fail-at,25"
        return [*lightning_command(run_dir, out, ranks, extra=extra), "cluster.slurm.max_failures=0"]

    crashed = subprocess.run(crashing(2), capture_output=True, text=True, timeout=300)
    assert crashed.returncode != 0 and "failing at step 25 on purpose" in crashed.stdout + crashed.stderr
    assert sorted(p.name for p in out.glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_10.ckpt", "hpc_ckpt_20.ckpt"]
    for log in out.glob("attempt0.rank*.txt"):  # what the crash lost: trained again from the checkpoint
        log.write_text("".join(line for line in log.read_text().splitlines(True) if int(line.split()[0]) <= 20))

    resumed = subprocess.run(crashing(1), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + (RunDir(run_dir).logs / "rank_0.restart1.log").read_text()
    assert "the checkpoint was written by 2 ranks and 1 resume it, with the same global batch" in said, said[-3000:]
    assert (out / "starts.txt").read_text().split() == ["0", "20"]
    assert trained(out) == trained(base) and sorted(trained(out)) == list(range(1, STEPS + 1))
    worst = weights_apart(out / "final.pt", baseline.ready())
    assert worst <= TOLERANCE, f"the weights differ by {worst:.2e} from the uninterrupted run's"
    print(f"Lightning: crashed at 25 on 2 ranks, resumed from its own checkpoint at 20 on 1: within {worst:.1e}")
