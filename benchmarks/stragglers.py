"""What finding stragglers costs a training step (``cluster.stragglers``): the rank's clock, and the exchange.

    python benchmarks/stragglers.py [--workloads mlp,cnn --steps 50 --repeats 5]

1. **The clock** (``ComputeClock``: a forward pre-hook, a gradient hook per parameter, one autograd callback per
   backward). Its cost does not depend on the model's size, only on its number of parameter tensors, so it is
   measured where nothing else is: a stand-in with as many parameter tensors as the workload, each a single
   number, trains ``--tiny-steps`` steps with the clock and without it, in alternating order, ``repeats`` times;
   the median of the paired differences is the clock's cost per step. Each workload of benchmarks/workloads.py
   is timed for its real step (forward, backward, AdamW), and the cost is given as a share of it. (Timing the
   workload itself with and without the clock measures this machine's noise: a few percent between runs.)
2. **The exchange** (one gather of one float64 per rank to rank 0, over gloo, once per window). Two processes
   time ``--gathers`` gathers; prints the median, and its share of a step at the default 60 s window for each
   workload's measured step time (a window holds window_s / step_s steps).

Run on an otherwise idle machine: the clock's cost is microseconds, under the noise of a busy one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.multiprocessing.spawn import start_processes
from workloads import WORKLOADS, synthetic

from hpc_train.distributed.stragglers import ComputeClock


def _steps(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, steps: int) -> float:
    """Seconds per step over ``steps`` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    started = time.perf_counter()
    for _ in range(steps):
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / steps


def step_time(name: str, steps: int) -> tuple[float, int]:
    """(seconds per step of the workload, its number of parameter tensors)."""
    workload = WORKLOADS[name]
    torch.manual_seed(0)
    model = workload.build()
    inputs, labels = synthetic(workload, workload.batch_size)
    _steps(model, inputs, labels, 5)  # warm up: allocations, the first AdamW step
    return _steps(model, inputs, labels, steps), len(list(model.parameters()))


def clock_cost(tensors: int, steps: int, repeats: int) -> float:
    """The clock's seconds per step on a model of ``tensors`` one-number parameter tensors (median of pairs)."""
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(1)) for _ in range(tensors))

    class Stand(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.stack(list(self.weights)).sum()

    stand = Stand()
    inputs, labels = torch.ones(1, 2), torch.zeros(1, dtype=torch.long)
    _steps(stand, inputs, labels, 50)
    differences = []
    for repeat in range(repeats):
        times = {}
        for clocked in (False, True) if repeat % 2 else (True, False):
            clock = ComputeClock(stand) if clocked else None
            times[clocked] = _steps(stand, inputs, labels, steps)
            if clock is not None:
                assert clock.take()[1] == steps
                clock.close()
        differences.append(times[True] - times[False])
    return statistics.median(differences)


def _gathers(rank: int, folder: str, count: int, out: str) -> None:
    import torch.distributed as dist

    store = Path(folder, "store").as_uri()  # a file store, through the init method torch's stubs type
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    mine = torch.tensor([0.1 * rank], dtype=torch.float64)
    times = []
    for _ in range(count):
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(2)] if rank == 0 else None
        started = time.perf_counter()
        dist.gather(mine, gathered, dst=0)
        times.append(time.perf_counter() - started)
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(statistics.median(times)))
    dist.destroy_process_group()


def exchange_cost(count: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "median")
        start_processes(_gathers, args=(folder, count, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            return float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp,cnn")
    parser.add_argument("--steps", type=int, default=20, help="steps that time each workload's real step")
    parser.add_argument("--tiny-steps", type=int, default=2000, help="steps of the stand-in, per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--gathers", type=int, default=200)
    parser.add_argument("--window", type=float, default=60.0, help="cluster.stragglers.window_s")
    parser.add_argument("--tensors", default="100", help="the clock on stand-ins of these many tensors too")
    args = parser.parse_args()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    gather = exchange_cost(args.gathers)
    print(f"exchange: one gather of 2 ranks over gloo, median {gather * 1e6:.0f} us", flush=True)
    for name in args.workloads.split(","):
        step, tensors = step_time(name, args.steps)
        added = clock_cost(tensors, args.tiny_steps, args.repeats)
        per_window = gather / max(1.0, args.window / step)
        print(
            f"{name:12s} step {step * 1e3:8.2f} ms, {tensors} parameter tensors; the clock {added * 1e6:+6.1f} us a "
            f"step ({100 * added / step:+.3f}%); the exchange every {args.window:g} s {per_window * 1e6:.2f} us a "
            f"step ({100 * per_window / step:.4f}%)",
            flush=True,
        )
    for tensors in (int(n) for n in args.tensors.split(",") if n):
        added = clock_cost(tensors, args.tiny_steps // 4, args.repeats)
        print(f"{tensors} parameter tensors: the clock {added * 1e6:+6.1f} us a step", flush=True)


if __name__ == "__main__":
    main()
