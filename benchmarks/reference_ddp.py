"""The reference: a hand-written PyTorch DDP training loop, as a tutorial would write it. Launch with torchrun:

    torchrun --standalone --nproc-per-node=2 benchmarks/reference_ddp.py --workload mlp --threads 1

DistributedSampler + DataLoader over an in-memory TensorDataset, DistributedDataParallel, AdamW, and the loss
read on the host every LOG_EVERY steps. Rank 0 prints when its first optimizer step ended and how long steps
warmup..warmup+steps took (see workloads.report).
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from workloads import LOG_EVERY, WORKLOADS, measure_marks, parse_args, report, synthetic


def main() -> None:
    args = parse_args(__doc__, ())
    torch.set_num_threads(args.threads)
    start_mark, end_mark = measure_marks(args.warmup, args.steps)

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    workload = WORKLOADS[args.workload]
    torch.manual_seed(0)
    x, y = synthetic(workload, workload.samples_needed(end_mark, world))
    dataset = TensorDataset(x, y)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=workload.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(
        workload.build().to(device), device_ids=[local_rank] if device.type == "cuda" else None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else nullcontext()

    first_step = window_start = 0.0
    sampler.set_epoch(0)
    for step, (inputs, targets) in enumerate(loader, start=1):
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast:
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            first_step = time.time()
        if step % LOG_EVERY == 0:
            value = loss.item()  # waits for the device, as printing the loss does
            if rank == 0:
                print(f"step {step} loss {value:.4f}", flush=True)
            if step == start_mark:
                window_start = time.perf_counter()
            if step == end_mark:
                window = time.perf_counter() - window_start
                break
    if rank == 0:
        report(first_step, window, (end_mark - start_mark) * workload.batch_size * world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
