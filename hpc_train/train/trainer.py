"""The training loop: setup (``__init__``), ``fit``, ``close``.

Every rank runs the same steps in the same order: the decisions to log, validate, stop early or checkpoint
depend only on the step and epoch counters (and on metrics already reduced over all ranks), so the
collectives inside them line up across ranks without extra messages.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from hpc_train.config import Config
from hpc_train.dist import DistEnv
from hpc_train.faults import fault_from_env
from hpc_train.rundir import RunDir
from hpc_train.train.checkpoint import prune_checkpoints, save_atomic
from hpc_train.train.data import make_datasets, make_loaders
from hpc_train.train.early_stopping import EarlyStopping
from hpc_train.train.metrics import MetricsWriter
from hpc_train.train.models import build_model
from hpc_train.train.observe import Observer
from hpc_train.train.optim import build_optimizer, scaled_lr
from hpc_train.train.precision import Precision
from hpc_train.train.schedule import build_scheduler
from hpc_train.train.strategy import wrap_model
from hpc_train.train.usercode import build_loss, build_metric

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Trains ``cfg.model`` on ``cfg.data``; rank 0 writes metrics, plots, checkpoints and the final model."""

    def __init__(self, cfg: Config, env: DistEnv, device: torch.device, run_dir: RunDir) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        tc = cfg.trainer
        # Same seed on every rank: identical initial weights (DDP would broadcast rank 0's anyway) and data.
        torch.manual_seed(tc.seed)
        train_set, val_set = make_datasets(cfg.data)
        self.train_loader, self.sampler, self.val_loader = make_loaders(
            train_set, val_set, cfg.data, tc.batch_size, tc.seed, env, cuda=device.type == "cuda"
        )
        self.raw_model = build_model(cfg.model, cfg.data.input_shape, cfg.data.num_classes).to(device)
        self.model, self.no_sync = wrap_model(self.raw_model, tc.strategy, device, tc.ddp)
        self.loss_fn = build_loss(tc.loss)
        self.metric_name, self.metric_fn = build_metric(tc.metric)
        self.precision = Precision(tc.precision, device)
        self.accumulate = tc.accumulate_grad_batches
        self.global_batch = tc.batch_size * env.world_size * self.accumulate
        self.lr = scaled_lr(tc.lr, tc.lr_scaling, self.global_batch, tc.lr_reference_batch_size)
        self.optimizer = build_optimizer(cfg.optim, self.model.parameters(), self.lr)
        # Leftover micro-batches at the end of an epoch (fewer than `accumulate`) are skipped, not carried over.
        self.steps_per_epoch = len(self.train_loader) // self.accumulate
        self.total_steps = self._total_steps()
        self.scheduler = build_scheduler(self.optimizer, tc.schedule, self.total_steps)
        self.early_stopping = EarlyStopping(tc.early_stopping, device)
        # From here on each rank draws its own random numbers (dropout), as in nanoGPT's seed offset.
        torch.manual_seed(tc.seed + env.rank)

        self.step = 0
        self.epoch = 0
        self.metrics = MetricsWriter(run_dir.metrics, enabled=env.is_main)
        self.observer = Observer(cfg, env, device, run_dir)
        self.progress = tqdm(
            total=self.total_steps,
            desc="train",
            unit="step",
            disable=not (env.is_main and tc.progress_bar),
            file=sys.stderr,
            mininterval=1.0,
            dynamic_ncols=False,
            ncols=110,
        )
        self._fit_start = self._window_start = 0.0
        self._window_steps = 0
        # The window's loss stays a tensor on the device: reading it with .item() every step would make the host
        # wait for the device each step. It is read (and reduced across ranks) only when a row is written.
        self._window_loss = torch.zeros((), device=device)
        self._step_lr = self.lr
        self._fault = fault_from_env()

    def _total_steps(self) -> int:
        tc = self.cfg.trainer
        total = min(tc.max_steps or math.inf, (tc.max_epochs or math.inf) * self.steps_per_epoch)
        assert math.isfinite(total), "config validation guarantees max_steps or max_epochs"
        return int(total)

    # ---- the loop -------------------------------------------------------------------------------------------

    def fit(self) -> None:
        """Train until max_steps, max_epochs or early stopping, validating and writing metrics on the way."""
        self._announce()
        self._fit_start = self._window_start = time.perf_counter()
        self.model.train()
        self.observer.start()
        epochs = range(self.cfg.trainer.max_epochs) if self.cfg.trainer.max_epochs else itertools.count()
        for epoch in epochs:
            self.epoch = epoch
            self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same permutation on every rank
            batches = iter(self.train_loader)
            for step_in_epoch in range(self.steps_per_epoch):
                self._optimizer_step([next(batches) for _ in range(self.accumulate)])
                self.step += 1
                if self._fault is not None:
                    self._fault.maybe_fire(self.env.rank, self.step)
                stop = self._after_step(end_of_epoch=step_in_epoch + 1 == self.steps_per_epoch)
                if stop or self.step >= self.total_steps:
                    self._save_final()
                    return

    def _optimizer_step(self, micro_batches: list[Any]) -> None:
        """One optimizer step over ``accumulate`` micro-batches; gradients are all-reduced on the last only."""
        scaler = self.precision.scaler
        for index, (inputs, targets) in enumerate(micro_batches):
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            # DDP all-reduces during backward; skipping that on all but the last micro-batch lets gradients add
            # up locally and crosses the network once per optimizer step.
            sync = index == len(micro_batches) - 1
            with nullcontext() if sync else self.no_sync():
                with self.precision.autocast():
                    # Divided so the accumulated gradient is that of the mean over all micro-batches.
                    loss = self.loss_fn(self.model(inputs), targets) / self.accumulate
                scaler.scale(loss).backward()
            self._window_loss += loss.detach().float()
        if self.cfg.trainer.grad_clip_norm:
            scaler.unscale_(self.optimizer)  # clip the true gradients, not the fp16-scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip_norm)
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self._step_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self._window_steps += 1
        self.observer.step()

    def _after_step(self, end_of_epoch: bool) -> bool:
        """Log, validate, checkpoint as due; True when early stopping ends training."""
        tc = self.cfg.trainer
        last = self.step >= self.total_steps
        validate = self.val_loader is not None and (
            last
            or (tc.val_every_n_steps > 0 and self.step % tc.val_every_n_steps == 0)
            or (end_of_epoch and tc.val_every_n_epochs > 0 and (self.epoch + 1) % tc.val_every_n_epochs == 0)
        )
        stop = False
        if last or validate or self.step % tc.log_every_n_steps == 0:
            self.run_dir.write_status(self.env.rank, "running", step=self.step, **self.observer.memory())
            row = self._close_window() | self.observer.memory()
            if validate:
                row |= self.validate()
                stop = self._early_stop(row)
            self._report(row)
        if tc.checkpoint_every_n_steps and self.step % tc.checkpoint_every_n_steps == 0:
            self._save_checkpoint()
        self.progress.update(1)
        return stop

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
            "lr": self._step_lr,
            "samples_per_s": self._window_steps * self.global_batch / max(now - self._window_start, 1e-9),
            "time_s": now - self._fit_start,
        }
        self._window_loss.zero_()
        self._window_steps = 0
        self._window_start = now
        return row

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Loss and metric over exactly the validation set: each sample is seen once, on one rank."""
        assert self.val_loader is not None
        self.raw_model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, metric sum, count
        for inputs, targets in self.val_loader:
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self.precision.autocast():
                outputs = self.raw_model(inputs)
            outputs = outputs.float()
            batch = targets.shape[0]
            sums[0] += self.loss_fn(outputs, targets).double() * batch  # losses are batch means
            sums[1] += self.metric_fn(outputs, targets).double().sum()
            sums[2] += batch
        dist.all_reduce(sums)
        self.raw_model.train()
        loss_sum, metric_sum, count = sums.tolist()
        return {"val_loss": loss_sum / count, self.metric_name: metric_sum / count, "val_samples": int(count)}

    def _early_stop(self, row: dict[str, Any]) -> bool:
        es = self.cfg.trainer.early_stopping
        improved, stop = self.early_stopping.update(float(row[es.monitor]))
        if improved and self.env.is_main and es.patience:
            self._save_weights(self.run_dir.model_best)
            row["best"] = True
        if stop:
            log.info(
                "early stopping at step %d: %s has not improved on %.4g for %d validations",
                self.step,
                es.monitor,
                self.early_stopping.best,
                es.patience,
            )
            row["early_stop"] = True
        return stop

    def _report(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        self.observer.scalars(row)
        if self.env.is_main:
            text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
            self.progress.set_postfix(
                loss=f"{row['train_loss']:.4f}", samples_s=f"{row['samples_per_s']:.0f}", refresh=False
            )
            log.info("%s", text)

    def _announce(self) -> None:
        tc = self.cfg.trainer
        name = self.cfg.model.get("_target_") if isinstance(self.cfg.model, dict) else self.cfg.model.name
        log.info(
            "training %s on %d rank(s), strategy %s, %s: global batch %d (%d per rank x %d ranks x %d accumulated), "
            "lr %.3g (base %.3g, %s scaling vs reference batch %d, %s schedule), %d steps (%d per epoch)",
            name,
            self.env.world_size,
            tc.strategy,
            tc.precision,
            self.global_batch,
            tc.batch_size,
            self.env.world_size,
            self.accumulate,
            self.lr,
            tc.lr,
            tc.lr_scaling,
            tc.lr_reference_batch_size,
            tc.schedule.name,
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
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "config": self._config_dict(),
        }
        save_atomic(state, folder / f"step_{self.step:09d}.pt")
        prune_checkpoints(folder, self.cfg.trainer.keep_checkpoints)

    def _save_weights(self, path: Any) -> None:
        save_atomic({k: v.detach().cpu().clone() for k, v in self.raw_model.state_dict().items()}, path)

    def _save_final(self) -> None:
        if self.env.is_main:
            self._save_weights(self.run_dir.model_final)
            log.info("saved %s", self.run_dir.model_final)

    def close(self) -> None:
        """Release files, the profiler and the progress bar; write the plots. Safe after a failure."""
        self.progress.close()
        self.metrics.close()
        self.observer.close()
