"""The DDP training loop: setup (``__init__``), ``fit``, ``close``.

Every rank runs the same steps in the same order: the decisions to log, validate or checkpoint depend only on
the step and epoch counters, so the collectives inside them line up across ranks without extra messages.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from hpc_train.config import Config
from hpc_train.dist import DistEnv
from hpc_train.faults import fault_from_env
from hpc_train.rundir import RunDir
from hpc_train.train.checkpoint import prune_checkpoints, save_atomic
from hpc_train.train.data import make_loaders, make_synthetic
from hpc_train.train.metrics import MetricsWriter
from hpc_train.train.models import build_model
from hpc_train.train.optim import build_optimizer, scaled_lr

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Trains ``cfg.model`` on ``cfg.data`` with DDP; rank 0 writes metrics, checkpoints and the final model."""

    def __init__(self, cfg: Config, env: DistEnv, device: torch.device, run_dir: RunDir) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        tc = cfg.trainer
        # Same seed on every rank: identical initial weights (DDP would broadcast rank 0's anyway) and data.
        torch.manual_seed(tc.seed)
        train_set, val_set = make_synthetic(cfg.data)
        self.train_loader, self.sampler, self.val_loader = make_loaders(
            train_set, val_set, cfg.data, tc.batch_size, tc.seed, env, pin_memory=device.type == "cuda"
        )
        self.raw_model = build_model(cfg.model, cfg.data.input_shape, cfg.data.num_classes).to(device)
        self.model = DDP(self.raw_model, device_ids=[device.index] if device.type == "cuda" else None)
        self.global_batch = tc.batch_size * env.world_size
        self.lr = scaled_lr(tc.lr, tc.lr_scaling, self.global_batch, tc.lr_reference_batch_size)
        self.optimizer = build_optimizer(cfg.optim, self.model.parameters(), self.lr)
        # From here on each rank draws its own random numbers (dropout), as in nanoGPT's seed offset.
        torch.manual_seed(tc.seed + env.rank)

        self.steps_per_epoch = len(self.train_loader)
        self.total_steps = self._total_steps()
        self.step = 0
        self.epoch = 0
        self.metrics = MetricsWriter(run_dir.metrics, enabled=env.is_main)
        self.progress = tqdm(
            total=self.total_steps,
            desc="train",
            unit="step",
            disable=not (env.is_main and tc.progress_bar),
            file=sys.stderr,
            mininterval=1.0,
            dynamic_ncols=False,
            ncols=100,
        )
        self._fit_start = 0.0
        self._window_start = 0.0
        self._window_steps = 0
        # The window's loss stays a tensor on the device: reading it with .item() every step would make the host
        # wait for the device each step. It is read (and reduced across ranks) only when a row is written.
        self._window_loss = torch.zeros((), device=device)
        self._fault = fault_from_env()

    def _total_steps(self) -> int:
        limits = [
            self.cfg.trainer.max_steps or math.inf,
            (self.cfg.trainer.max_epochs or math.inf) * self.steps_per_epoch,
        ]
        total = min(limits)
        assert math.isfinite(total), "config validation guarantees max_steps or max_epochs"
        return int(total)

    # ---- the loop -------------------------------------------------------------------------------------------

    def fit(self) -> None:
        """Train until ``max_steps`` or ``max_epochs``, validating and writing metrics on the way."""
        self._announce()
        self._fit_start = self._window_start = time.perf_counter()
        self.model.train()
        epochs = range(self.cfg.trainer.max_epochs) if self.cfg.trainer.max_epochs else itertools.count()
        for epoch in epochs:
            self.epoch = epoch
            self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same permutation on every rank
            for batch_index, (inputs, targets) in enumerate(self.train_loader):
                self._train_step(inputs, targets)
                self.step += 1
                if self._fault is not None:
                    self._fault.maybe_fire(self.env.rank, self.step)
                self._after_step(end_of_epoch=batch_index + 1 == self.steps_per_epoch)
                if self.step >= self.total_steps:
                    self._save_final()
                    return

    def _train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        loss = F.cross_entropy(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces (averages) the gradients during backward
        self.optimizer.step()
        self._window_loss += loss.detach()
        self._window_steps += 1

    def _after_step(self, end_of_epoch: bool) -> None:
        tc = self.cfg.trainer
        last = self.step >= self.total_steps
        validate = self.cfg.data.num_val > 0 and (
            last
            or (tc.val_every_n_steps > 0 and self.step % tc.val_every_n_steps == 0)
            or (end_of_epoch and tc.val_every_n_epochs > 0 and (self.epoch + 1) % tc.val_every_n_epochs == 0)
        )
        if last or validate or self.step % tc.log_every_n_steps == 0:
            # Heartbeat for `python -m hpc_train.jobs status`: where each rank was last seen.
            self.run_dir.write_status(self.env.rank, "running", step=self.step)
            row = self._close_window()
            if validate:
                row |= self.validate()
            self._report(row)
        if tc.checkpoint_every_n_steps and self.step % tc.checkpoint_every_n_steps == 0:
            self._save_checkpoint()
        self.progress.update(1)

    # ---- metrics --------------------------------------------------------------------------------------------

    def _close_window(self) -> dict[str, Any]:
        """Mean training loss over ranks and steps since the last row, and the global throughput."""
        stats = torch.stack([self._window_loss, torch.tensor(float(self._window_steps), device=self.device)])
        dist.all_reduce(stats)  # sums over ranks: [sum of per-step mean losses, steps x world size]
        now = time.perf_counter()
        loss_sum, count = stats.tolist()
        row = {
            "step": self.step,
            "epoch": self.epoch,
            "train_loss": loss_sum / count,
            "lr": self.optimizer.param_groups[0]["lr"],
            "samples_per_s": self._window_steps * self.global_batch / max(now - self._window_start, 1e-9),
            "time_s": now - self._fit_start,
        }
        self._window_loss.zero_()
        self._window_steps = 0
        self._window_start = now
        return row

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Loss and accuracy over exactly the validation set: each sample is seen once, on one rank."""
        self.raw_model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, count
        for inputs, targets in self.val_loader:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            logits = self.raw_model(inputs)
            sums[0] += F.cross_entropy(logits, targets, reduction="sum").double()
            sums[1] += (logits.argmax(dim=1) == targets).sum()
            sums[2] += targets.numel()
        dist.all_reduce(sums)
        self.raw_model.train()
        loss_sum, correct, count = sums.tolist()
        return {"val_loss": loss_sum / count, "val_acc": correct / count, "val_samples": int(count)}

    def _report(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        if self.env.is_main:
            text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
            self.progress.set_postfix(loss=f"{row['train_loss']:.4f}", refresh=False)
            log.info("%s", text)

    def _announce(self) -> None:
        tc = self.cfg.trainer
        log.info(
            "training %s on %d rank(s): global batch %d (%d per rank x %d), lr %.3g (base %.3g, %s scaling vs "
            "reference batch %d), %d steps (%d per epoch)",
            self.cfg.model.name,
            self.env.world_size,
            self.global_batch,
            tc.batch_size,
            self.env.world_size,
            self.lr,
            tc.lr,
            tc.lr_scaling,
            tc.lr_reference_batch_size,
            self.total_steps,
            self.steps_per_epoch,
        )

    # ---- files ----------------------------------------------------------------------------------------------

    def _config_dict(self) -> Any:
        return OmegaConf.to_container(OmegaConf.structured(self.cfg))

    def _save_checkpoint(self) -> None:
        if not self.env.is_main:
            return
        folder = self.run_dir.checkpoints
        state = {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "config": self._config_dict(),
        }
        save_atomic(state, folder / f"step_{self.step:09d}.pt")
        prune_checkpoints(folder, self.cfg.trainer.keep_checkpoints)

    def _save_final(self) -> None:
        if self.env.is_main:
            weights = {k: v.detach().cpu().clone() for k, v in self.raw_model.state_dict().items()}
            save_atomic(weights, self.run_dir.model_final)
            log.info("saved %s", self.run_dir.model_final)

    def close(self) -> None:
        """Release files and the progress bar; safe after a failure."""
        self.progress.close()
        self.metrics.close()
