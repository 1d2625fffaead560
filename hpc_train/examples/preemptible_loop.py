"""A hand-written torchrun loop that stops with its peers on preemption and resumes from its own checkpoint.

    python -m hpc_train script.module=hpc_train.examples.preemptible_loop 'script.args=[--out,DIR]'

Rank 0 records each attempt's first step (``starts.txt``) and the step reached (``step.txt``), for tests.
The data of a step depends only on the step and the rank, so a run stopped and resumed ends with the same
weights as one that was not. With ``--no-integration`` it never asks hpc_train anything: it saves every
``--save-every`` steps and dies of the preemption signal like any script would.

The gradients are averaged with one all-reduce per parameter rather than by DDP: DDP regroups its gradient
buckets after the first step, so a resumed DDP run sums in another order than the uninterrupted one, and with
more than 2 ranks gloo's sums then differ in the last bits (hpc_train's own trainer primes the buckets for this;
a hand-written loop would have to do the same).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def save(obj: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: a run killed while saving keeps the previous file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.03)
    parser.add_argument("--no-integration", action="store_true")
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not args.no_integration:
        # only with the integration on: --no-integration shows the same loop without hpc_train
        from hpc_train import preemption

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    step = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    if rank == 0:
        with open(os.path.join(args.out, "starts.txt"), "a") as f:
            f.write(f"{step}\n")
    while step < args.steps:
        generator = torch.Generator().manual_seed(step * world + rank)
        inputs, targets = torch.randn(16, 8, generator=generator), torch.randint(0, 2, (16,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        for grad in [p.grad for p in model.parameters() if p.grad is not None]:  # the mean over the ranks, in order
            dist.all_reduce(grad)
            grad /= world  # in place: the parameter's own gradient
        optimizer.step()
        step += 1
        time.sleep(args.sleep)
        if rank == 0:  # where the run is, for tests that signal it mid-run
            with open(os.path.join(args.out, "step.txt"), "w") as f:
                f.write(f"{step}\n")
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        if args.no_integration:
            if rank == 0 and step % args.save_every == 0:
                save(state, checkpoint)
        elif preemption.should_stop(step):
            if rank == 0:
                save(state, checkpoint)
            break
    else:
        if rank == 0:
            save(model.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
