"""A Hugging Face Trainer script made preemption-safe by hpc_train's callback (the README's example, runnable).

    python -m hpc_train script.module=hpc_train.examples.hf_trainer 'script.args=[--out,DIR]'

A small regression model on random data, several epochs, shuffled by the Trainer's sampler; the model
returns its loss as any transformers model does. On rank 0 it records each attempt's first step
(``starts.txt``) and rank count (``ranks.txt``), the step reached (``step.txt``, for tests that signal mid-run) and, once it has trained
``--steps`` steps, the weights (``final.pt``). ``--report-to mlflow,wandb`` logs to the run dir's tracker runs
(hpc_train's ``tracking.*`` gives the script their ids); ``--save-steps`` checkpoints every that many steps, and
``--fail-at`` makes rank 0's first attempt raise at that step (for tests of a crash and its restart);
``--samples DIR`` has each rank write the samples of every batch it reads (``DIR/attempt<A>.rank<R>.txt``);
``--data`` sets the data set's size and ``--batch-sleep`` paces each batch read (``--sleep`` paces each step).
With ``script.global_batch`` it keeps that global batch on any node count (the callback sets the accumulation);
with ``--keep-batch`` it calls ``keep_global_batch`` first, which may set a smaller per-device batch (``--batch``,
8 by default) where the accumulation alone cannot make the global batch.
"""

import argparse
import os
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from hpc_train import preemption
from hpc_train.integrations.transformers import PreemptionCallback, keep_global_batch, last_checkpoint


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, log: str = "", sleep: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = self.x.sum(-1) + 0.1 * torch.randn(n, generator=generator)
        self.log, self.sleep = log, sleep

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        if self.log:  # test instrumentation: the samples of each batch this rank reads, in order
            with open(self.log, "a") as f:
                f.write(" ".join(map(str, indices)) + "\n")
        time.sleep(self.sleep)  # --batch-sleep: a pace per batch, so a step of more accumulated batches takes longer
        return [self[i] for i in indices]


class Progress(TrainerCallback):
    """Test instrumentation: paces the steps and tells the test where the run is."""

    def __init__(self, out: str, sleep: float, fail_at: int = 0) -> None:
        self.out, self.sleep, self.started, self.fail_at = out, sleep, False, fail_at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and not self.started:
            with open(os.path.join(self.out, "starts.txt"), "a") as f:
                f.write(f"{state.global_step}\n")
            with open(os.path.join(self.out, "ranks.txt"), "a") as f:
                f.write(f"{args.world_size}\n")
        self.started = True
        time.sleep(self.sleep)

    def on_step_end(self, args, state, control, **kwargs):
        if args.process_index == 0:
            with open(os.path.join(self.out, "step.txt"), "w") as f:
                f.write(f"{state.global_step}\n")
            failed = os.path.join(self.out, "failed.txt")
            if state.global_step == self.fail_at and not os.path.exists(failed):
                open(failed, "w").close()
                raise RuntimeError(f"failing at step {state.global_step} on purpose (--fail-at)")


def samples_log(folder: str) -> str:
    """This rank's sample log in ``folder`` for this attempt ('' without a folder)."""
    if not folder:
        return ""
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"attempt{preemption.restart_count()}.rank{os.environ.get('RANK', '0')}.txt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--report-to", default="none", help="e.g. mlflow,wandb")
    parser.add_argument("--logging-steps", type=int, default=500)
    parser.add_argument("--save-steps", type=int, default=0, help="0: only the stop checkpoint")
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--samples", default="", help="a folder for the per-rank sample logs (tests)")
    parser.add_argument("--data", type=int, default=256, help="samples in the data set")
    parser.add_argument("--batch-sleep", type=float, default=0.0, help="seconds each batch takes to read")
    parser.add_argument("--batch", type=int, default=8, help="the per-device batch")
    parser.add_argument("--keep-batch", action="store_true", help="keep_global_batch(args) before the Trainer")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    set_seed(0)  # before the model is built: its initial weights come from this seed
    model, checkpoints = Regression(), os.path.join(args.out, "checkpoints")
    training = TrainingArguments(
        output_dir=checkpoints,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=0.01,
        save_strategy="steps" if args.save_steps else "no",  # the callback still checkpoints on preemption
        save_steps=args.save_steps or 500,
        logging_steps=args.logging_steps,
        report_to=args.report_to.split(","),
        disable_tqdm=True,
        use_cpu=True,  # on CPU, these two make the Trainer distributed: without them each rank trains alone
        ddp_backend="gloo",
        seed=0,
    )
    if args.keep_batch:
        training = keep_global_batch(training)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Samples(args.data, samples_log(args.samples), args.batch_sleep),
        callbacks=[PreemptionCallback(), Progress(args.out, args.sleep, args.fail_at)],
    )
    trainer.train(resume_from_checkpoint=last_checkpoint(checkpoints))
    if trainer.is_world_process_zero():
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    main()
