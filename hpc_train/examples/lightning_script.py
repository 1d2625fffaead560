"""A Lightning script made preemption-safe by hpc_train's callback (the README's example, runnable).

    python -m hpc_train script.module=hpc_train.examples.lightning_script 'script.args=[--out,DIR]'

A small regression model on random data, several epochs, shuffled by a seeded DistributedSampler and served
by torchdata's StatefulDataLoader, so a resume mid-epoch continues with the next batch. On rank 0 it records
each attempt's first step (``starts.txt``) and rank count (``ranks.txt``), the step reached (``step.txt``, for
tests that signal mid-run) and, once it has trained ``--steps`` steps, the weights (``final.pt``).
``--signal-at A --signal-at B`` makes the first attempt send itself the preemption signal at step A, the second
at B, and so on, for tests that need the stops at known places. ``--save-every N`` adds Lightning's own
ModelCheckpoint every N steps and ``--fail-at`` makes rank 0's first attempt raise at a step (for tests of a
crash); ``--hidden`` and ``--layers`` make the model wider and deeper (a step of real compute, for tests of a
slow node). ``--logger mlflow`` logs to the MLflow run that hpc_train's ``tracking.mlflow.*`` made for the run dir
(the variables it gives the script name it). ``--samples DIR`` has every rank write, for each batch it trains, the
optimizer step it counts towards and its samples (``attempt<A>.rank<R>.txt``), for tests that compare the
data order across shapes.

With ``script.global_batch`` (say 16: 8 a rank on 2 ranks), hpc_train's callback sets ``accumulate_grad_batches``
to keep it on whatever rank count the run gets (2 on one rank), and a stop checkpoint resumes on another rank
count at the next step: the DistributedSampler gives step t the same 16 samples on any rank count, as long as
the data set (``--data``) is a whole number of global batches, so that every rank count splits an epoch alike.
"""

import argparse
import os
import signal
import time

import lightning.pytorch as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from hpc_train import preemption
from hpc_train.integrations.lightning import PreemptionCallback, last_checkpoint, trainer_shape


class Regression(pl.LightningModule):
    def __init__(self, samples: int = 256, hidden: int = 32, layers: int = 1) -> None:
        super().__init__()
        self.samples = samples
        inner = [m for _ in range(layers - 1) for m in (torch.nn.Linear(hidden, hidden), torch.nn.Tanh())]
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), *inner, torch.nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, _ = batch  # the third: the samples' indices, for --samples
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self) -> StatefulDataLoader:
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(self.samples, 8, generator=generator)
        y = x.sum(-1) + 0.1 * torch.randn(self.samples, generator=generator)
        data = torch.utils.data.TensorDataset(x, y, torch.arange(self.samples))
        # Shuffled by a seeded sampler: the order of an epoch is a function of (seed, epoch), so a resumed run
        # draws the same one. (shuffle=True would draw it from the global RNG, which Lightning does not save.)
        sampler = torch.utils.data.DistributedSampler(data, shuffle=True, seed=0)
        # On a resume, Lightning builds the loader's iterator before it sets the sampler's epoch: set it here.
        sampler.set_epoch(self.trainer.current_epoch)
        return StatefulDataLoader(data, batch_size=8, sampler=sampler)


class Progress(pl.Callback):
    """Test instrumentation: paces the steps and tells the test where the run is."""

    def __init__(self, out: str, sleep: float, signal_at: list[int], samples: str = "", fail_at: int = 0) -> None:
        self.out, self.sleep, self.started, self.samples = out, sleep, False, samples
        attempt = preemption.restart_count()
        self.fail_at = fail_at if attempt == 0 else 0
        self.signal_at = signal_at[attempt] if attempt < len(signal_at) else -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.samples:  # the optimizer step this batch counts towards, and its samples
            name = f"attempt{preemption.restart_count()}.rank{trainer.global_rank}.txt"
            with open(os.path.join(self.samples, name), "a") as f:
                f.write(" ".join(str(i) for i in [trainer.global_step + 1, *batch[2].tolist()]) + "\n")
        if trainer.is_global_zero and not self.started:
            with open(os.path.join(self.out, "starts.txt"), "a") as f:
                f.write(f"{trainer.global_step}\n")
            with open(os.path.join(self.out, "ranks.txt"), "a") as f:
                f.write(f"{trainer.world_size}\n")
        self.started = True
        time.sleep(self.sleep)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.signal_at:
            self.signal_at = -1  # once (the step stays while batches accumulate)
            os.kill(os.getpid(), signal.SIGUSR2)  # as Slurm would, on every rank
        if trainer.is_global_zero:
            with open(os.path.join(self.out, "step.txt"), "w") as f:
                f.write(f"{trainer.global_step}\n")
            if self.fail_at and trainer.global_step == self.fail_at:
                raise RuntimeError(f"failing at step {trainer.global_step} on purpose (--fail-at)")


def _periodic(out: str, every: int) -> list[pl.Callback]:
    """Lightning's own checkpoints every ``every`` steps, named as the callback's, so that ``last_checkpoint``
    finds the newest of either (a crash resumes from the last of these)."""
    if not every:
        return []
    return [
        pl.callbacks.ModelCheckpoint(
            dirpath=out,
            filename="hpc_ckpt_{step}",
            auto_insert_metric_name=False,
            every_n_train_steps=every,
            save_top_k=-1,
        )
    ]


def _logger(name: str) -> pl.loggers.Logger | bool:
    if name == "mlflow":  # the run hpc_train made: its variables name the store, the experiment and the run
        return pl.loggers.MLFlowLogger(
            experiment_name=os.environ["MLFLOW_EXPERIMENT_NAME"],
            tracking_uri=os.environ["MLFLOW_TRACKING_URI"],
            run_id=os.environ.get("MLFLOW_RUN_ID"),
        )
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument(
        "--signal-at", type=int, action="append", default=[], help="attempt k signals itself at the k-th given step"
    )
    parser.add_argument("--logger", choices=["none", "mlflow"], default="none")
    parser.add_argument("--samples", default="", help="a folder for the per-rank sample logs (tests)")
    parser.add_argument("--data", type=int, default=256, help="samples in the data set")
    parser.add_argument("--save-every", type=int, default=0, help="a ModelCheckpoint every that many steps")
    parser.add_argument("--fail-at", type=int, default=0, help="rank 0's first attempt raises at this step")
    parser.add_argument("--hidden", type=int, default=32, help="the hidden layers' width")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers (more: a step of real compute)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    pl.seed_everything(0)
    trainer = pl.Trainer(
        # One Lightning process per rank hpc_train started: devices=LOCAL_WORLD_SIZE,
        # num_nodes=WORLD_SIZE // LOCAL_WORLD_SIZE (devices="auto" on CPU fails in Lightning).
        **trainer_shape(),
        accelerator="cpu",
        strategy="ddp",
        use_distributed_sampler=False,  # the loader brings its own DistributedSampler
        max_steps=args.steps,
        default_root_dir=args.out,  # where the callback's hpc_ckpt_<step>.ckpt files go: this run's own folder
        callbacks=[
            PreemptionCallback(),
            Progress(args.out, args.sleep, args.signal_at, args.samples, args.fail_at),
            *_periodic(args.out, args.save_every),
        ],
        logger=_logger(args.logger),
        enable_checkpointing=bool(args.save_every),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Regression(args.data, args.hidden, args.layers)
    trainer.fit(model, ckpt_path=last_checkpoint(args.out))
    if trainer.is_global_zero:
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    main()
