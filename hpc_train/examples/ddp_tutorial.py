"""A DDP script written the way torchrun tutorials write them: nothing in it knows about hpc_train.

    torchrun --nproc-per-node=2 ddp_tutorial.py --out DIR
    python -m hpc_train script.path=ddp_tutorial.py 'script.args=[--out,DIR]'   # the same, from hpc_train
    python -m hpc_train script.module=hpc_train.examples.ddp_tutorial 'script.args=[--out,DIR]'  # as installed

Each rank trains a toy model for a few steps and writes what it saw to DIR/rank<RANK>.json.
"""

import argparse
import gc
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(steps: int) -> dict:
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)

    model = torch.nn.Linear(10, 1)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    for _ in range(steps):
        inputs = torch.randn(8, 10) + rank  # each rank sees different data
        loss = ddp_model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return {
        "rank": rank,
        "local_rank": local_rank,
        "world_size": dist.get_world_size(),
        "env": {
            k: os.environ[k]
            for k in (
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "LOCAL_WORLD_SIZE",
                "GROUP_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            )
        },
        "host": socket.gethostname(),
        "weight_sum": float(model.weight.detach().sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")  # env:// reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    seen = train(args.steps)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{seen['rank']}.json"), "w") as f:
        json.dump(seen, f)
    # The DDP model lives in reference cycles: collect it while the interpreter is whole, else gloo's threads
    # may be torn down at exit and abort a finished script ("terminate called without an active exception").
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
