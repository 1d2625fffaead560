"""The same workload through Lightning's Trainer with DDP (needs the optional extra: pip install -e .[bench]).

    python benchmarks/lightning_ddp.py --workload mlp --ranks 2 --threads 1

Lightning starts the other ranks itself (it re-runs this script per rank). A callback marks the end of the first
optimizer step and the throughput window on rank 0, and reads the loss every LOG_EVERY steps like the others.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from workloads import LOG_EVERY, WORKLOADS, Workload, measure_marks, parse_args, report, synthetic


# lightning's classes are Any to mypy: pyproject does not follow the optional extras (their types would depend
# on which extras a machine has), so subclassing them is subclassing Any.
class Classifier(L.LightningModule):  # type: ignore[misc]
    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.net = workload.build()
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss: torch.Tensor = self.loss_fn(self.net(inputs), targets)  # self's attributes are Any (its base is)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Marks(L.Callback):  # type: ignore[misc]  # Any to mypy, as above
    def __init__(self, start_mark: int, end_mark: int, batch_size: int) -> None:
        self.start_mark, self.end_mark, self.batch_size = start_mark, end_mark, batch_size
        self.first_step = self.window_start = 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        step = trainer.global_step  # optimizer steps done
        if step == 1 and not self.first_step:
            self.first_step = time.time()
        if step % LOG_EVERY == 0:
            outputs["loss"].item()
            if step == self.start_mark:
                self.window_start = time.perf_counter()
            if step == self.end_mark and trainer.global_rank == 0:
                window = time.perf_counter() - self.window_start
                samples = (self.end_mark - self.start_mark) * self.batch_size * trainer.world_size
                report(self.first_step, window, samples)


def main() -> None:
    args = parse_args(__doc__, (("ranks", 1),))
    torch.set_num_threads(args.threads)
    start_mark, end_mark = measure_marks(args.warmup, args.steps)

    workload = WORKLOADS[args.workload]
    L.seed_everything(0, verbose=False)
    x, y = synthetic(workload, workload.samples_needed(end_mark, args.ranks))
    loader = DataLoader(TensorDataset(x, y), batch_size=workload.batch_size, shuffle=True, drop_last=True)
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=args.ranks,
        strategy="ddp" if args.ranks > 1 else "auto",
        precision="bf16-mixed" if args.precision == "bf16" else "32-true",
        max_steps=end_mark,
        callbacks=[Marks(start_mark, end_mark, workload.batch_size)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Classifier(workload), loader)


if __name__ == "__main__":
    main()
