"""The physical limit: the workload's forward, backward and AdamW step on tensors already in memory.

No process group, no DDP, no DataLoader, no sampler: each step slices the next batch out of one tensor. The
driver starts one such process per rank at once (threads each = cores / ranks), so the sum of their
throughputs is what the cores can do with zero communication and zero input-pipeline cost.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
from torch import nn
from workloads import LOG_EVERY, WORKLOADS, measure_marks, parse_args, report, synthetic


def main() -> None:
    args = parse_args(__doc__, (("seed", 0),))
    torch.set_num_threads(args.threads)
    start_mark, end_mark = measure_marks(args.warmup, args.steps)
    device = torch.device(args.device)

    workload = WORKLOADS[args.workload]
    torch.manual_seed(args.seed)
    x, y = synthetic(workload, workload.samples_needed(end_mark, 1), seed=args.seed)
    x, y = x.to(device), y.to(device)
    model = workload.build().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else nullcontext()

    first_step = window_start = window = 0.0
    batch = workload.batch_size
    for step in range(1, end_mark + 1):
        inputs, targets = x[(step - 1) * batch : step * batch], y[(step - 1) * batch : step * batch]
        with autocast:
            loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            first_step = time.time()
        if step % LOG_EVERY == 0:
            loss.item()
            if step == start_mark:
                window_start = time.perf_counter()
            if step == end_mark:
                window = time.perf_counter() - window_start
    report(first_step, window, (end_mark - start_mark) * batch)


if __name__ == "__main__":
    main()
