"""What a checkpoint costs training, synchronous against in the background (``trainer.checkpoint_async``).

    python benchmarks/checkpoint_async.py [--width 4096 --layers 5 --steps 24 --every 6 --dir /tmp]
    python benchmarks/checkpoint_async.py --ranks 2 [--steps 60 --every 5 --width 4096 --layers 3]

An MLP of ``layers`` square Linear layers (4096 x 5: 84M parameters, 1.0 GB of checkpoint state with AdamW's
two moments) trains ``steps`` steps three times: without checkpoints, with a synchronous checkpoint every
``every`` steps, and with a background one. Each checkpoint goes through the trainer's own writer
(``hpc_train.train.writer.CheckpointWriter``: the ledger, SHA-256, fsync, rename). Prints, per mode, the time
training was blocked per checkpoint (median and max) and the total run time, and the background writes' own
duration. Run it on the file system your checkpoints go to (--dir).

On a CPU-only machine the background writer shares the cores with training (hashing and copying are CPU work),
so the steps that overlap a write get slower: the total time says how much of the write was hidden.

With ``--ranks N`` the same three modes run as a user runs them: ``python -m hpc_train`` on the local launcher
with N ranks, an MLP of ``layers`` hidden layers of ``width`` (784 inputs; 4096 x 3 makes a 442 MB checkpoint),
a checkpoint every ``every`` steps. Prints each run's time from launch to exit, what the checkpoints add to it,
and the background writes' cost as a fraction of the synchronous writes'.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc_train.core.rundir import RunDir
from hpc_train.train.checkpoint import Checkpoints
from hpc_train.train.writer import CheckpointWriter


def _model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks[:-1])


@dataclass(frozen=True)
class Result:
    """One mode's run: its total time, the seconds training was blocked per checkpoint, each background (or
    synchronous) write's own duration, and the size of the newest checkpoint (through hpc_train: the blocked
    seconds and write durations of background saves only, as rank 0's log has them)."""

    mode: str
    total: float
    blocked: list[float]
    writes: list[float]
    size: int
    training: float | None = None
    """Through hpc_train: the fit's own seconds, to its last metrics row (no start-up, no final save)."""

    def line(self) -> str:
        text = f"{self.mode:>5}: total {self.total:.1f} s"
        if self.training is not None:
            text += f" (training {self.training:.1f} s)"
        if self.size:
            text += f"; checkpoint {self.size / 2**30:.2f} GiB"
        if self.blocked:
            text += (
                f"; training blocked per checkpoint: median {statistics.median(self.blocked):.3f} s, "
                f"max {max(self.blocked):.3f} s"
            )
        if self.writes:
            text += f"; the write itself: median {statistics.median(self.writes):.2f} s"
        return text


def _run(args: argparse.Namespace, mode: str, folder: Path) -> Result:
    device = torch.device(args.device)
    model = _model(args.width, args.layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1)).to(device)
    writer = CheckpointWriter(
        Checkpoints(RunDir(folder / mode)), asynchronous=mode == "async", pinned=device.type == "cuda"
    )  # as the trainer builds it
    blocked: list[float] = []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mode != "none" and step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            blocked.append(writer.save(state, step, keep=1))
    writer.wait()
    if device.type == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - started
    writes = [saved.seconds for saved in writer.finished()]
    size = sum(p.stat().st_size for p in (folder / mode / "checkpoints").glob("step_*.pt")) if blocked else 0
    return Result(mode=mode, total=total, blocked=blocked, writes=writes, size=size)


def _run_hpc_train(args: argparse.Namespace, mode: str, folder: Path) -> Result:
    """One mode through ``python -m hpc_train``: N ranks on the local launcher, rank 0 checkpointing."""
    run_dir = folder / mode
    every = args.every if mode != "none" else args.steps + 1  # none: only the final weights
    command = [
        sys.executable,
        "-m",
        "hpc_train",
        f"hydra.run.dir={run_dir}",
        "cluster=local",
        f"cluster.tasks_per_node={args.ranks}",
        f"cluster.cpus_per_task={max(1, len(os.sched_getaffinity(0)) // args.ranks)}",
        *([f"cluster.gpus_per_node={args.ranks}", "trainer.device=cuda"] if args.device == "cuda" else []),
        "model=mlp",
        f"model.hidden_sizes=[{','.join([str(args.width)] * args.layers)}]",
        "data.input_shape=[784]",
        f"data.num_samples={args.steps * args.batch * args.ranks}",
        "data.val_fraction=0",
        f"trainer.batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=0",
        f"trainer.checkpoint_every_n_steps={every}",
        "trainer.keep_checkpoints=2",
        f"trainer.checkpoint_async={str(mode == 'async').lower()}",
        "trainer.val_every_n_epochs=0",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
        "trainer.plots=false",
    ]
    started = time.perf_counter()
    with (folder / f"{mode}.out").open("w") as out:  # the launcher's own output, for a run that fails
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=args.steps * 30 + 300)
    total = time.perf_counter() - started
    log = (run_dir / "logs" / "rank_0.log").read_text()
    blocked = [float(s) for s in re.findall(r"checkpoint \(\w+\) at step \d+: blocked ([0-9.]+) s", log)]
    writes = [float(s) for s in re.findall(r"checkpoint of step \d+ durable after ([0-9.]+) s", log)]
    size = max((p.stat().st_size for p in (run_dir / "checkpoints").glob("step_*.pt")), default=0)
    rows = RunDir(run_dir).read_metrics()
    return Result(
        mode=mode,
        total=total,
        blocked=blocked,
        writes=writes,
        size=size if mode != "none" else 0,
        training=rows[-1]["time_s"] if rows else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--ranks", type=int, default=0, help="run through python -m hpc_train with this many ranks")
    parser.add_argument("--modes", default="none,sync,async", help="with --ranks: which of none,sync,async to run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model trains")
    parser.add_argument("--json", type=Path, help="also write the figures there")
    args = parser.parse_args()
    if args.every > args.steps:
        parser.error(f"--every {args.every} is more than --steps {args.steps}: there would be no checkpoint to time")
    if args.ranks:
        _through_hpc_train(args)
        return
    params = sum(p.numel() for p in _model(args.width, args.layers).parameters())
    threads = torch.get_num_threads()
    print(
        f"{params / 1e6:.1f}M parameters on {args.device}, {args.steps} steps, a checkpoint every {args.every}; "
        f"torch threads: {threads}"
    )
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for mode in ("none", "sync", "async"):
            results[mode] = _run(args, mode, Path(folder))
            print(results[mode].line(), flush=True)
    base, sync, background = (results[m].total for m in ("none", "sync", "async"))
    sync_blocked = statistics.median(results["sync"].blocked)
    async_blocked = statistics.median(results["async"].blocked)
    print(
        f"blocking: background {async_blocked:.3f} s = {100 * async_blocked / sync_blocked:.1f}% of a synchronous "
        f"save ({sync_blocked:.3f} s); checkpoint overhead on the run: sync {sync - base:+.1f} s, background "
        f"{background - base:+.1f} s"
    )
    if args.json:
        figures = {
            "device": args.device,
            "parameters": params,
            "checkpoint_bytes": results["sync"].size,
            "steps": args.steps,
            "every": args.every,
            "total_s": {mode: round(r.total, 3) for mode, r in results.items()},
            "blocked_median_s": {m: round(statistics.median(results[m].blocked), 4) for m in ("sync", "async")},
            "blocked_max_s": {m: round(max(results[m].blocked), 4) for m in ("sync", "async")},
            "async_blocked_share_of_sync": round(async_blocked / sync_blocked, 4),
            "overhead_share_of_run": {m: round(results[m].total / base - 1, 4) for m in ("sync", "async")},
        }
        args.json.write_text(json.dumps(figures, indent=1))


def _through_hpc_train(args: argparse.Namespace) -> None:
    print(f"{args.ranks} ranks (python -m hpc_train), {args.steps} steps, a checkpoint every {args.every}")
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for mode in args.modes.split(","):
            results[mode] = _run_hpc_train(args, mode, Path(folder))
            print(results[mode].line(), flush=True)
    if set(results) != {"none", "sync", "async"}:
        return
    base, sync, background = (results[m].total for m in ("none", "sync", "async"))
    print(
        f"launch to exit: checkpoints add {sync - base:+.1f} s synchronous, {background - base:+.1f} s in the "
        f"background ({_share(background - base, sync - base)} of synchronous) to a {base:.1f} s run"
    )
    base, sync, background = (results[m].training or 0.0 for m in ("none", "sync", "async"))
    print(
        f"training alone: {sync - base:+.1f} s synchronous, {background - base:+.1f} s in the background "
        f"({_share(background - base, sync - base)} of synchronous) on {base:.1f} s"
    )


def _share(background: float, sync: float) -> str:
    """What the background saves cost as a share of the synchronous saves' cost; none where those cost nothing
    measurable (a small run: the division would fail or mean nothing)."""
    return f"{background / sync:.2f}" if sync > 0 else "n/a"


if __name__ == "__main__":
    main()
