"""What a checkpoint costs training, synchronous against in the background (``trainer.checkpoint_async``).

    python benchmarks/checkpoint_async.py [--width 4096 --layers 5 --steps 24 --every 6 --dir /tmp]

An MLP of ``layers`` square Linear layers (4096 x 5: 84M parameters, 1.0 GB of checkpoint state with AdamW's
two moments) trains ``steps`` steps three times: without checkpoints, with a synchronous checkpoint every
``every`` steps, and with a background one. Each checkpoint goes through the trainer's own writer
(``hpc_train.train.writer.CheckpointWriter``: the ledger, SHA-256, fsync, rename). Prints, per mode, the time
training was blocked per checkpoint (median and max) and the total run time, and the background writes' own
duration. Run it on the file system your checkpoints go to (--dir).

On a CPU-only machine the background writer shares the cores with training (hashing and copying are CPU work),
so the steps that overlap a write get slower: the total time says how much of the write was hidden.
"""

from __future__ import annotations

import argparse
import statistics
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
    synchronous) write's own duration, and the size of the newest checkpoint."""

    mode: str
    total: float
    blocked: list[float]
    writes: list[float]
    size: int

    def line(self) -> str:
        text = f"{self.mode:>5}: total {self.total:.1f} s"
        if self.blocked:
            text += (
                f"; checkpoint {self.size / 2**30:.2f} GiB; training blocked per checkpoint: median "
                f"{statistics.median(self.blocked):.3f} s, max {max(self.blocked):.3f} s; the write itself: median "
                f"{statistics.median(self.writes):.2f} s"
            )
        return text


def _run(args: argparse.Namespace, mode: str, folder: Path) -> Result:
    model = _model(args.width, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))
    writer = CheckpointWriter(Checkpoints(RunDir(folder / mode)), asynchronous=mode == "async")
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
    total = time.perf_counter() - started
    writes = [saved.seconds for saved in writer.finished()]
    size = sum(p.stat().st_size for p in (folder / mode / "checkpoints").glob("step_*.pt")) if blocked else 0
    return Result(mode=mode, total=total, blocked=blocked, writes=writes, size=size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    params = sum(p.numel() for p in _model(args.width, args.layers).parameters())
    threads = torch.get_num_threads()
    print(
        f"{params / 1e6:.1f}M parameters, {args.steps} steps, a checkpoint every {args.every}; torch threads: {threads}"
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
        f"save ({sync_blocked:.3f} s); checkpoint overhead on the run: sync +{sync - base:.1f} s, background "
        f"+{background - base:.1f} s"
    )


if __name__ == "__main__":
    main()
