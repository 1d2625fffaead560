"""A hand-written torchrun loop that keeps its global batch and data order on any node count.

    python -m hpc_train script.module=hpc_train.examples.global_batch_loop 'script.args=[--out,DIR,--per-rank,16]' \\
        script.global_batch=48 cluster=slurm cluster.nodes=3 cluster.min_nodes=2

``hpc_train.global_batch.GlobalBatch`` gives the loop its per-rank batch and accumulation for the ranks it has
today (script.global_batch=48 with --per-rank 16: 16 a rank on 3 ranks; on 2, 24 a rank a step, as 2
micro-batches of 12), and a sampler whose step t is the same 48 samples on any rank count. The loop saves its own
checkpoint when the ranks agree to stop (``hpc_train.preemption``) and resumes from it on whatever shape the job
comes back on.

For tests: rank 0 records each attempt's first step (``starts.txt``), its rank count (``ranks.txt``) and the step
reached (``step.txt``); ``--sleep`` paces each micro-batch (a step on fewer ranks takes longer, as it would); ``--samples DIR`` has every rank write the samples of each of its micro-batches, with their
step (``DIR/attempt<A>.rank<R>.txt``: test instrumentation, one file per rank, not for a large job);
``--save-every N`` also checkpoints every N steps, which a run that lost a node goes on from.

The gradients are averaged with one all-reduce per parameter, as in ``preemptible_loop``: the run's sums then do
not depend on DDP's bucket order (they still depend on the rank count: another shape agrees to rounding).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hpc_train import preemption
from hpc_train.global_batch import GlobalBatch


class Numbered(Dataset):
    """A regression set whose items carry their index, so that a rank can say which samples it trained on."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = self.x.sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def save(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: a run killed while saving keeps the previous file


def record(path: str, line: str, mode: str = "a") -> None:
    with open(path, mode) as f:
        f.write(line + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--per-rank", type=int, default=8, help="the per-rank batch on the full shape")
    parser.add_argument("--samples-total", type=int, default=960)
    parser.add_argument("--sleep", type=float, default=0.01, help="seconds a micro-batch takes on top")
    parser.add_argument("--samples", default="", help="a folder for the per-rank sample logs (tests)")
    parser.add_argument("--save-every", type=int, default=0, help="also checkpoint every that many steps")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    dist.init_process_group("gloo")
    batch = GlobalBatch.of(per_rank=args.per_rank, steps=args.steps)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    step = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    if batch.rank == 0:
        print(f"step {step}: {batch.describe()}", flush=True)
        record(os.path.join(args.out, "starts.txt"), str(step))
        record(os.path.join(args.out, "ranks.txt"), str(batch.ranks))
    data = Numbered(args.samples_total)
    sampler = batch.sampler(len(data), seed=0, step=step)
    loader = DataLoader(data, batch_size=batch.per_rank, sampler=sampler)
    log = (
        os.path.join(args.samples, f"attempt{preemption.restart_count()}.rank{batch.rank}.txt") if args.samples else ""
    )
    stopped, micro = False, 0
    while step < args.steps and not stopped:
        for index, x, y in loader:
            # The loss of a micro-batch is its mean over its samples, divided by the micro-batches of a step: summed
            # over them and averaged over the ranks below, the gradient is the mean over the global batch.
            loss = torch.nn.functional.mse_loss(model(x), y) / batch.accumulate
            loss.backward()
            if log:
                record(log, f"{step + 1} " + " ".join(map(str, index.tolist())))
            time.sleep(args.sleep)
            micro += 1
            if micro % batch.accumulate:
                continue
            for grad in [p.grad for p in model.parameters() if p.grad is not None]:
                dist.all_reduce(grad)
                grad /= batch.ranks
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if batch.rank == 0:
                record(os.path.join(args.out, "step.txt"), str(step), mode="w")
            if preemption.should_stop(step):  # every rank, every step
                if batch.rank == 0:
                    save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, checkpoint)
                stopped = True
                break
            if args.save_every and step % args.save_every == 0 and batch.rank == 0:  # what a crash goes on from
                save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, checkpoint)
            if step >= args.steps:
                break
        sampler.set_epoch(sampler.epoch + 1)
    if not stopped and batch.rank == 0:
        save(model.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
