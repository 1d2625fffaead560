"""The training loop: setup (``__init__``), ``fit``, ``close``.

Every rank runs the same steps in the same order: the decisions to log, validate, stop early or checkpoint
depend only on the step and epoch counters (and on metrics already reduced over all ranks), so the
collectives inside them line up across ranks without extra messages.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator, Sized
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from tqdm import tqdm

from hpc_train.config import Config, TrainerConfig
from hpc_train.config.shape import Shape
from hpc_train.core.errors import ConfigError, Diverged, tag_step
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import shows_progress_bar
from hpc_train.distributed import DistEnv
from hpc_train.distributed.stragglers import StragglerWatch, rank_places
from hpc_train.mirror import Store, read_ledger, restore_newest
from hpc_train.mirror.store import describe_error
from hpc_train.mirror.sync import MirrorUnreadable, holds_this_run, other_run
from hpc_train.train.checkpoint import (
    CheckpointRecord,
    Checkpoints,
    capture_rng,
    load_init_weights,
    nonfinite_entries,
    restore_rng,
    save_atomic,
    verify_checkpoint,
)
from hpc_train.train.data import SYNTHETIC_VERSION, Loader, make_datasets, make_loaders
from hpc_train.train.divergence import DIVERGED_HINT, DivergenceGuard
from hpc_train.train.early_stopping import EarlyStopping
from hpc_train.train.feed import DeviceBatches, DeviceFeed, set_bytes
from hpc_train.train.hooks import BUILDING_MODEL, STARTING_FIT, FitResult, StepObserver
from hpc_train.train.models import build_model
from hpc_train.train.observe import Observer
from hpc_train.train.optim import build_optimizer, scaled_lr
from hpc_train.train.precision import Precision
from hpc_train.train.schedule import build_scheduler
from hpc_train.train.stopping import StopSignals
from hpc_train.train.strategy import wrap_model
from hpc_train.train.usercode import build_loss, build_metric
from hpc_train.train.window import MetricsWindow
from hpc_train.train.writer import CheckpointWriter

__all__ = ["FitResult", "Trainer"]

LISTEN_EVERY_S = 0.05
"""During validation the ranks agree on stop signals about this often (by rank 0's batches): a stop waits at
most that long, plus a batch; a check costs about a millisecond of gloo round trip."""
CHECKPOINT_SHARE = 0.01
"""The most of the training time that time-based checkpoints may take: a slower save stretches the interval."""


log = logging.getLogger(__name__)


class Trainer:
    """Trains ``cfg.model`` on ``cfg.data``; rank 0 writes metrics, plots, checkpoints and the final model.

    ``observer`` hears of each step, validation, metrics row and checkpoint (``StepObserver``): the runtime's
    watchdog, heartbeat and goodput progress file listen there; the trainer knows none of them.
    """

    def __init__(
        self,
        cfg: Config,
        env: DistEnv,
        device: torch.device,
        run_dir: RunDir,
        stop: StopSignals | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.cfg, self.env, self.device, self.run_dir = cfg, env, device, run_dir
        self.stop = stop or StopSignals(())
        self.observer = observer or StepObserver()
        self.checkpoints = Checkpoints(run_dir, self.observer.checkpoint_writer(torch.save))
        tc = cfg.trainer
        self.writer = CheckpointWriter(
            self.checkpoints,
            tc.checkpoint_async,
            pinned=device.type == "cuda",
            on_saved=self.observer.on_saved,
            on_seconds=self.observer.on_checkpoint_seconds,
        )
        """Rank 0's checkpoint writes: in the background with trainer.checkpoint_async."""
        # Same seed on every rank: identical initial weights (DDP would broadcast rank 0's anyway) and data.
        torch.manual_seed(tc.seed)
        train_set, val_set = make_datasets(cfg.data)
        self.train_loader, self.sampler, self.val_loader, self.loader_rng = make_loaders(
            train_set, val_set, cfg.data, tc.batch_size, tc.seed, env, device
        )
        self.observer.on_phase(BUILDING_MODEL)
        self.raw_model = build_model(cfg.model, cfg.data.input_shape, cfg.data.num_classes).to(device)
        self.model, self.no_sync = wrap_model(self.raw_model, tc.strategy, device, tc.ddp, env.world_size)
        if tc.compile:
            self.model = cast(torch.nn.Module, torch.compile(self.model))
        self.loss_fn = build_loss(tc.loss)
        self.metric_name, self.metric_fn = build_metric(tc.metric)
        self.precision = Precision(tc.precision, device)
        self.accumulate = tc.accumulate_grad_batches
        self.global_batch = tc.batch_size * env.world_size * self.accumulate
        self.lr = scaled_lr(tc.lr, tc.lr_scaling, self.global_batch, tc.lr_reference_batch_size)
        self.optimizer = build_optimizer(cfg.optim, self.model.parameters(), self.lr)
        self.steps_per_epoch = self._steps_per_epoch(len(cast(Sized, train_set)))
        self.total_steps = self._total_steps()
        self.scheduler = build_scheduler(self.optimizer, tc.schedule, self.total_steps)
        self.early_stopping = EarlyStopping(tc.early_stopping, device)
        self.divergence = DivergenceGuard(tc.divergence_steps)
        # From here on each rank draws its own random numbers (dropout), as in nanoGPT's seed offset.
        torch.manual_seed(tc.seed + env.rank)

        self.control: dist.ProcessGroup | None = None
        """Where control messages (stop flags, random states) go: gloo on the CPU (``resume`` makes it)."""
        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        """Optimizer steps done in the current epoch: where a resumed run picks the data up again."""
        self._epoch_loader_rng = self.loader_rng.get_state()
        self.telemetry = Observer(cfg, env, device, run_dir)
        self.progress = _progress_bar(self.total_steps, shown=env.is_main and tc.progress_bar)
        self.window = MetricsWindow(device, self.global_batch, self.lr)
        self._saved_step = -1
        """The step of this attempt's latest checkpoint, on every rank (-1: none yet)."""
        self._checkpoint_every_s = tc.checkpoint_every_min * 60
        """Time-based checkpoints: the interval in force on rank 0 (0: off); stretched when saves are slow."""
        self._last_checkpoint_at = time.monotonic()
        self._due_voted = False
        self._val_rounds: int | None = None
        """Validation batches on the rank with the most (agreed at the first validation)."""
        self.stop_saved_s: float | None = None
        """Seconds from this rank's stop signal to the durable checkpoint it stopped with (None: no stop, or
        another rank caught the signal)."""
        self.start_step = 0
        """The step this attempt started from (0, or the resumed checkpoint's): ``resume`` sets it."""
        self.metrics = run_dir.metrics_writer(enabled=False)  # rank 0's file is opened by resume, which may trim it
        self.stragglers: StragglerWatch | None = None
        self._resumed = False

    def resume(self) -> int:
        """Join the ranks' control group and continue from the newest verified checkpoint in the run dir, if there
        is one (the mirror's, where the run dir has none; else ``trainer.init_from``); then open rank 0's
        metrics file and the straggler watch. The step training goes on from (0 for a new run). ``fit`` calls it
        when the caller has not."""
        if self._resumed:
            return self.start_step
        # Control messages (stop flags, random states) go over gloo on the CPU: with NCCL they would make the
        # host wait for the GPU at every step.
        if self.control is None and dist.get_backend() != "gloo":
            self.control = dist.new_group(backend="gloo")
        self._resume()
        self.start_step = self.step
        self.metrics = self.run_dir.metrics_writer(enabled=self.env.is_main)  # after _resume, which may trim it
        self.stragglers = self._straggler_watch()
        self.observer.on_phase(STARTING_FIT)
        # Only now: a resume that raised is tried again by fit, which never trains past a checkpoint it did not load.
        self._resumed = True
        return self.start_step

    def _steps_per_epoch(self, samples: int) -> int:
        """Optimizer steps in an epoch of ``samples`` training samples. Leftover micro-batches at the end of an
        epoch (fewer than ``accumulate``) are skipped, not carried over. With data.drop_last: whole global batches
        of the epoch's order, the same count at any rank count, never the repeats the sampler pads a rank's share
        with (a run resumed on another shape then meets the same epochs)."""
        steps = len(self.train_loader) // self.accumulate
        return min(steps, samples // self.global_batch) if self.cfg.data.drop_last else steps

    def _straggler_watch(self) -> StragglerWatch | None:
        """Each rank's own compute time, shared with rank 0 every cluster.stragglers.window_s (None: one rank,
        or cluster.stragglers.enabled=false)."""
        sc = self.cfg.cluster.stragglers
        if not sc.enabled or self.env.world_size < 2:
            return None
        rows = self.run_dir.rank_table_entries() if self.env.is_main else []
        # Compiled, the hooks go on the compiled module's outside: a pre-hook inside would be traced with it.
        module = self.model if self.cfg.trainer.compile else self.raw_model
        return StragglerWatch(
            module,
            self.device,
            rank=self.env.rank,
            window_s=sc.window_s,
            margin=sc.margin,
            windows=sc.windows,
            where=rank_places(rows),
            on_report=self.observer.on_stragglers,
        )

    def _total_steps(self) -> int:
        tc = self.cfg.trainer
        total = min(tc.max_steps or math.inf, (tc.epoch_limit or math.inf) * self.steps_per_epoch)
        assert math.isfinite(total), "config validation guarantees max_steps or max_epochs"
        return int(total)

    # ---- the loop -------------------------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """Train until max_steps, max_epochs, early stopping (completed) or a stop signal (not completed, with
        the signal). An exception raised on the way is tagged with the step it came at (``core.errors.tag_step``)."""
        self.resume()
        try:
            completed, signal = self._fit()
            self.stop.settle()
            return FitResult(
                completed=completed,
                start_step=self.start_step,
                step=self.step,
                signal=signal,
                peak=self.telemetry.memory(),
                stop_saved_s=self.stop_saved_s,
            )
        except BaseException as exc:
            tag_step(exc, self.step)  # "the same step" tells a repeated failure
            self.writer.finish_after(exc)
            raise

    def _fit(self) -> tuple[bool, int]:
        """(completed, the stop signal or 0)."""
        self._announce()
        self.window.start()
        self.model.train()
        self.telemetry.start(self.step)
        self.observer.on_start(self.step)
        if self.stragglers is not None:
            self.stragglers.start(self.step)
        # Resumed from a checkpoint taken at the very end, or at an early stop that still holds (the same
        # patience): the run is over; running it again must not train on past it.
        stopped_early = 0 < self.cfg.trainer.early_stopping.patience <= self.early_stopping.bad_validations
        if self.step >= self.total_steps or stopped_early:
            self._save_final()
            return True, 0
        max_epochs = self.cfg.trainer.epoch_limit or math.inf
        while self.epoch < max_epochs:
            batches = self._epoch_batches()
            while self.step_in_epoch < self.steps_per_epoch:
                self._optimizer_step([next(batches) for _ in range(self.accumulate)])
                self.step += 1
                self.step_in_epoch += 1
                self.window.stepped()
                self.observer.on_step(self.step)
                early_stop, heard = self._after_step(end_of_epoch=self.step_in_epoch == self.steps_per_epoch)
                if early_stop or self.step >= self.total_steps:
                    return self._complete()
                # Whether any rank had a signal by the previous step: the same answer on every rank at this step.
                # (A signal heard during this step's validation or checkpoint already is.)
                stopped_by, due, window = (heard, False, False) if heard else self._agree()
                if window and self.stragglers is not None:  # every rank, at this same step
                    self.stragglers.exchange(self.step, self.control)
                if not stopped_by and self.step == self.start_step + 1:
                    # The first step can be long (a compile, the first collectives): a signal during it is
                    # served now, by a blocking agreement, rather than a step later.
                    stopped_by = self.stop.heard(self.control)[0]
                if due and not stopped_by and self._saved_step != self.step:
                    self._save_checkpoint(f"every {self._checkpoint_every_s / 60:.3g} min")
                    stopped_by = self.stop.heard(self.control)[0]  # a signal during the save: this one is its
                if stopped_by:
                    if self._saved_step != self.step:  # a step-count checkpoint of this very step is the same
                        self._save_checkpoint(f"signal {stopped_by}")
                    self._durable()
                    self._note_stop_saved()
                    return False, stopped_by
            self.epoch += 1
            self.step_in_epoch = 0
        return self._complete()

    def _agree(self, final: bool = False) -> tuple[int, bool, bool]:
        """One agreement after a step (``StopSignals.agree_all``): the stop signal, the divergence flag of an
        earlier step, whether rank 0's clock says a time-based checkpoint is due, and whether it says the ranks
        share their straggler figures now. Raises Diverged. ``final``: training has ended; the flags not agreed
        yet are, and no checkpoint or figures are asked for."""
        flagged, flagged_step = self.divergence.vote(final)
        vote = int(not final and self._checkpoint_due())
        window = int(not final and self.stragglers is not None and self.stragglers.due())
        agreed = self.stop.agree_all(self.control, [flagged, flagged_step, vote, window])
        signal, flagged, flagged_step, due, shared = agreed
        self.divergence.agreed(flagged, flagged_step)
        return signal, bool(due), bool(shared) and not final

    def _checkpoint_due(self) -> bool:
        """Rank 0's vote for a time-based checkpoint: once per save (the vote is agreed a step later, and the
        reduction then in flight must not ask for a second one)."""
        every = self._checkpoint_every_s
        if self._due_voted or not (self.env.is_main and every > 0):
            return False
        self._due_voted = time.monotonic() - self._last_checkpoint_at >= every
        return self._due_voted

    def _complete(self) -> tuple[bool, int]:
        """Training reached its end: the divergence flags still in flight are agreed first (a last step that
        went non-finite must not be saved as the result), then the end checkpoint and the final weights."""
        for _ in range(3):  # the flags of the last two steps, and the reduction still in flight (two steps behind)
            self._agree(final=True)
        self._save_end_checkpoint()
        self._durable()
        self._save_final()
        return True, 0

    def _epoch_batches(self) -> Iterator[Any]:
        """An iterator over this epoch's batches, from where a resumed run left off.

        The permutation depends only on seed and epoch (the same on every rank); the loader has its own
        generator, saved as it was at the start of the epoch, so making the iterator does not draw from the
        global random state (which would shift the dropout masks of a resumed run).
        """
        self.sampler.set_epoch(self.epoch)
        self.sampler.skip = self.step_in_epoch * self.accumulate * self.cfg.trainer.batch_size
        if self.step_in_epoch:
            self.loader_rng.set_state(self._epoch_loader_rng)
        else:
            self._epoch_loader_rng = self.loader_rng.get_state()
        return self._fed(self.train_loader)

    def _fed(self, loader: Loader) -> Iterator[Any]:
        """The loader's batches; from a DataLoader onto a GPU, copied one ahead beside the step (``DeviceFeed``)."""
        if self.device.type == "cuda" and isinstance(loader, DataLoader):
            return DeviceFeed(iter(loader), self.device)
        return iter(loader)

    def _optimizer_step(self, micro_batches: list[Any]) -> None:
        """One optimizer step over ``accumulate`` micro-batches; gradients are all-reduced on the last only."""
        scaler = self.precision.scaler
        step_loss = torch.zeros((), device=self.device)
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
            step_loss += loss.detach().float()
        window_loss = step_loss
        if self.cfg.trainer.grad_clip_norm:
            scaler.unscale_(self.optimizer)  # clip the true gradients, not the fp16-scaled ones
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip_norm)
            step_loss = step_loss + norm.detach().float() * 0  # a non-finite norm flags the step as well
        scale = self._scale_tensor()
        before = None if scale is None else scale.clone()
        scaler.step(self.optimizer)
        scaler.update()
        # fp16: a step whose gradients overflowed was skipped by the scaler (which then lowers its scale), and the
        # weights are untouched: not divergence, while the scale is still >= 1 (below 1, the overflow is not the
        # scale's doing: the model itself gives inf or NaN). Compared on the device: no wait for the host.
        after = self._scale_tensor()
        skipped = None if before is None or after is None else (after < before) & (before >= 1)
        self.divergence.flag(self.step + 1, step_loss, skipped)
        self.optimizer.zero_grad(set_to_none=True)
        self.window.add(window_loss, self.optimizer.param_groups[0]["lr"])
        self.scheduler.step()
        self.telemetry.step()

    def _scale_tensor(self) -> torch.Tensor | None:
        """fp16's loss scale as the scaler keeps it, a tensor on the device (None without fp16)."""
        scaler = self.precision.scaler
        if not scaler.is_enabled():
            return None
        scale = getattr(scaler, "_scale", None)  # torch keeps it there; get_scale() would read it to the host
        return scale if isinstance(scale, torch.Tensor) else torch.tensor(scaler.get_scale(), device=self.device)

    def _after_step(self, end_of_epoch: bool) -> tuple[bool, int]:
        """Log, validate, checkpoint as due: (whether early stopping ends training, the stop signal the ranks
        agreed on during validation or right after a checkpoint, or 0). A validation cut short by a stop is
        skipped: its row keeps the training metrics, and the resumed run goes on with the next step (the
        validation is not redone)."""
        tc = self.cfg.trainer
        if self.writer.asynchronous:
            self.writer.finished()  # a background write that ended since the last step
        last = self.step >= self.total_steps
        validate = self.val_loader is not None and (
            last
            or (tc.val_every_n_steps > 0 and self.step % tc.val_every_n_steps == 0)
            or (end_of_epoch and tc.val_every_n_epochs > 0 and (self.epoch + 1) % tc.val_every_n_epochs == 0)
        )
        stop, heard = False, 0
        if last or validate or self.step % tc.log_every_n_steps == 0:
            memory = self.telemetry.memory()
            self.observer.on_row(self.step, memory)
            row = self.window.close(self.step, self.epoch) | memory
            if validate:
                metrics = self._validate_unless_stopped()
                if isinstance(metrics, int):
                    heard = metrics
                    log.warning("validation at step %d cut short by signal %d: skipped", self.step, heard)
                else:
                    row |= metrics
                    stop = self._early_stop(row)
            self._report(row)
        if tc.checkpoint_every_n_steps and self.step % tc.checkpoint_every_n_steps == 0:
            self._save_checkpoint()
            if not heard:  # a signal during the save is served now: this checkpoint is the stop's
                heard = self.stop.heard(self.control)[0]
        self.progress.update(1)
        return stop, heard

    # ---- metrics --------------------------------------------------------------------------------------------

    def validate(self) -> dict[str, Any]:
        """Loss and metric over exactly the validation set: each sample is seen once, on one rank."""
        metrics = self._validate_unless_stopped(listen=False)
        assert isinstance(metrics, dict)
        return metrics

    @torch.no_grad()
    def _validate_unless_stopped(self, listen: bool = True) -> dict[str, Any] | int:
        """``validate``, or the stop signal when the ranks heard one before a batch (``listen``): every rank
        then leaves at the same batch. Ranks whose shard has fewer batches listen as often as the others."""
        assert self.val_loader is not None
        if self._val_rounds is None:
            rounds = torch.tensor([len(self.val_loader)], dtype=torch.int64)
            dist.all_reduce(rounds, op=dist.ReduceOp.MAX, group=self.control)
            self._val_rounds = int(rounds.item())
        self.raw_model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, metric sum, count
        batches = self._fed(self.val_loader)
        last_check, next_check, since = 0, 0, time.monotonic()
        for index in range(self._val_rounds):
            self.observer.on_phase("validating")
            if listen and index == next_check:
                # Rank 0 proposes how many batches to go until the next check: about LISTEN_EVERY_S of its own
                # batches. The MAX of the votes is its proposal, so every rank checks at the same batches.
                done = index - last_check
                per_batch = (time.monotonic() - since) / done if done else 0.0
                stride = max(1, min(1000, int(LISTEN_EVERY_S / per_batch))) if per_batch > 0 else 1
                heard, agreed = self.stop.heard(self.control, stride if self.env.is_main else 0)
                if heard:
                    self.raw_model.train()
                    return heard
                last_check, next_check, since = index, index + max(1, agreed), time.monotonic()
            batch = next(batches, None)
            if batch is None:  # this rank's shard is shorter by a batch
                continue
            inputs, targets = batch
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self.precision.autocast():
                outputs = self.raw_model(inputs)
            outputs = outputs.float()
            size = targets.shape[0]
            sums[0] += self.loss_fn(outputs, targets).double() * size  # losses are batch means
            sums[1] += self.metric_fn(outputs, targets).double().sum()
            sums[2] += size
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
        self.telemetry.scalars(row)
        self.observer.on_metrics(row)
        if self.env.is_main:
            text = " ".join(f"{k}={_shown(k, v)}" for k, v in row.items())
            self.progress.set_postfix(
                loss=f"{row['train_loss']:.4f}", samples_s=f"{row['samples_per_s']:.0f}", refresh=False
            )
            log.info("%s", text)

    def _announce(self) -> None:
        tc = self.cfg.trainer
        name = self.cfg.model.get("_target_") if isinstance(self.cfg.model, dict) else self.cfg.model.name
        log.info(
            "training %s on %d rank(s), strategy %s, %s: global batch %d (%d per rank x %d ranks x %d accumulated), "
            "lr %.3g (base %.3g, %s scaling vs reference batch %d, %s schedule), %d steps (%d per epoch; %s)",
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
            self._binding_limit(),
        )

        log.info("%s", checkpoint_policy(tc))
        log.info("input: %s", self._input_path())

    def _input_path(self) -> str:
        """Where the batches come from (``data.on_device``), for the rank's log."""
        if isinstance(self.train_loader, DeviceBatches):
            size = set_bytes(self.train_loader.tensors) / 2**20
            return f"the training set kept on {self.device} ({size:.1f} MiB), each batch gathered there"
        why = (
            ""
            if self.cfg.data.on_device is False
            else " (data.on_device keeps only in-memory tensor sets, read without workers, within a quarter of the"
            " GPU's free memory)"
        )
        if self.device.type == "cuda":
            return f"a DataLoader on the host, each batch copied to {self.device} one step ahead{why}"
        return "a DataLoader"

    def _binding_limit(self) -> str:
        return binding_limit(self.cfg.trainer, self.steps_per_epoch)

    # ---- files ----------------------------------------------------------------------------------------------

    def _config_dict(self) -> Any:
        return OmegaConf.to_container(OmegaConf.structured(self.cfg))

    def _save_checkpoint(self, why: str = "periodic") -> None:
        """One checkpoint of the whole job; every rank calls this at the same step.

        Every rank first checks that its weights and optimizer state are finite (a non-finite state is never
        saved: the run has diverged, and its last checkpoint stays the last finite state). Each rank's random
        state is gathered to rank 0, which writes the file; the barrier at the end means that when any rank
        returns, the checkpoint is complete on disk, or (trainer.checkpoint_async) copied and being written in
        the background, durable once ``_durable`` returns.
        """
        self.observer.on_phase("checkpointing")
        self._refuse_nonfinite_state()
        # Per rank: the random state, and the loss summed since the last metrics row (a row after the resume
        # then averages the same steps as the uninterrupted run's).
        mine = {"rng": capture_rng(self.device), "window_loss": self.window.loss.detach().cpu()}
        ranks: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(ranks, mine, group=self.control)
        if self.env.is_main:
            blocked = self.writer.save(self._checkpoint_state(ranks), self.step, self.cfg.trainer.keep_checkpoints)
            self._note_save_time(blocked)
            if self.writer.asynchronous:
                log.info(
                    "checkpoint (%s) at step %d: blocked %.3f s, written in the background", why, self.step, blocked
                )
            else:
                log.info("checkpoint (%s) at step %d: %s", why, self.step, self.run_dir.checkpoint(self.step))
            self.writer.finished()
        self._saved_step = self.step
        self._last_checkpoint_at = time.monotonic()
        self._due_voted = False
        dist.barrier(group=self.control)

    def _durable(self) -> None:
        """Every rank returns once the latest checkpoint is durable: rank 0 waits for a background write (a stop,
        the end of training); a synchronous one already is."""
        if not self.cfg.trainer.checkpoint_async:
            return
        if self.env.is_main:
            self.observer.on_phase("checkpointing")
            self.writer.wait()
            self.writer.finished()
        dist.barrier(group=self.control)

    def _note_stop_saved(self) -> None:
        """Every rank has the checkpoint of this step durable (``_save_checkpoint`` ends with a barrier, and
        ``_durable`` waits for a background write): how long after the signal, as this rank counts it."""
        if self.stop.received_at is not None:
            self.stop_saved_s = time.monotonic() - self.stop.received_at
            log.info(
                "stop: the checkpoint of step %d was durable %.2f s after the signal", self.step, self.stop_saved_s
            )

    def _refuse_nonfinite_state(self) -> None:
        """Diverged, on every rank at once, when any rank's weights or optimizer state hold NaN or inf."""
        bad = nonfinite_entries({"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict()})
        flag = torch.tensor([int(bool(bad))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        if flag.item():
            where = f" ({', '.join(bad[:3])})" if bad else " (on another rank)"
            raise Diverged(
                f"training diverged: the weights or optimizer state are not finite at step {self.step}{where}; "
                f"nothing was saved, and the last checkpoint, which is finite, is kept. {DIVERGED_HINT}"
            )

    def _note_save_time(self, seconds: float) -> None:
        """The first save says what time-based checkpoints cost; one slower than CHECKPOINT_SHARE of the
        interval stretches the interval (rank 0 alone decides when they are due)."""
        every = self._checkpoint_every_s
        if not every:
            return
        if seconds > CHECKPOINT_SHARE * every * 1.1:
            self._checkpoint_every_s = seconds / CHECKPOINT_SHARE
            log.info(
                "a checkpoint took %.3g s, more than %.0f%% of trainer.checkpoint_every_min=%.3g: time-based "
                "checkpoints now come every %.1f min",
                seconds,
                CHECKPOINT_SHARE * 100,
                self.cfg.trainer.checkpoint_every_min,
                self._checkpoint_every_s / 60,
            )
        elif self._saved_step < 0:  # the first save of this attempt
            log.info(
                "a checkpoint takes %.3g s: %.2g%% of the time with one every %.3g min",
                seconds,
                100 * seconds / every,
                every / 60,
            )

    def _save_end_checkpoint(self) -> None:
        """A complete run keeps a checkpoint of its last step too, so that a resubmission with a larger
        trainer.max_steps goes on from there instead of from step 0. Every rank calls this at the same step."""
        if self._saved_step != self.step:
            self._save_checkpoint("end of training")

    def _checkpoint_state(self, ranks: list[Any]) -> dict[str, Any]:
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "loader_rng": self._epoch_loader_rng,
            "rng": [r["rng"] for r in ranks],
            "window": [[r["window_loss"] for r in ranks], self.window.steps],
            "world_size": self.env.world_size,
            "shape": self._shape().record(),
            "early_stopping": [self.early_stopping.best, self.early_stopping.bad_validations],
            "synthetic_version": SYNTHETIC_VERSION,
            "config": self._config_dict(),
            "trackers": [r.to_json() for r in self.run_dir.tracker_runs()],  # which runs hold this run's rows
        }

    def _resume(self) -> None:
        """Continue from the newest verified checkpoint in the run dir, if there is one.

        Rank 0 removes what killed writers left, picks the file (setting damaged ones aside) and tells the
        others, so all ranks load the same one even if a file system shows them different listings. The others
        check its size against the ledger's record, that it loads, and that it is finite.
        """
        choice: list[Any] = [None, None]
        found = None
        if self.env.is_main:
            self.checkpoints.clean_leftovers()
            found = self.checkpoints.newest() or self._from_mirror()
            records = {r.file: r for r in self.checkpoints.records()}
            if found is not None:
                record = records.get(found[0].name)
                choice = [str(found[0]), None if record is None else record.to_json()]
        dist.broadcast_object_list(choice, src=0, group=self.control)
        if choice[0] is None:
            if self.env.is_main:  # rows of an attempt that left no checkpoint: this one trains those steps again
                self.run_dir.drop_metrics_after(0)
            self._init_from()
            return
        path = Path(choice[0])
        if found is not None:
            state = found[1]  # rank 0 has read and verified it already
        else:
            record = None if choice[1] is None else CheckpointRecord.from_json(choice[1])
            if record is not None and path.stat().st_size != record.size:
                raise ValueError(f"{path} has {path.stat().st_size} bytes on this node, the ledger says {record.size}")
            state = verify_checkpoint(path, None)
        before = self._written_by(path, state)
        self._check_same_data(path, state)
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.precision.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.step_in_epoch = state["step"], state["epoch"], state["step_in_epoch"]
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        self._epoch_loader_rng = state["loader_rng"]
        self.early_stopping.best, self.early_stopping.bad_validations = state["early_stopping"]
        window_losses, window_steps = state["window"]
        lr = self.optimizer.param_groups[0]["lr"]
        if before is None:  # the same ranks: each goes on with its own random stream and loss sum
            self.window.restore(window_losses[self.env.rank], window_steps, lr)
            restore_rng(state["rng"][self.env.rank], self.device)
        else:
            # Another rank count: the loss summed since the last row is shared out so that the row's mean over
            # ranks is the same; a rank's own random stream (dropout) cannot carry over, so each gets a new one.
            self.window.restore(sum(window_losses) / len(window_losses), window_steps, lr)
            torch.manual_seed(self.cfg.trainer.seed + self.env.rank + 1_000_003 * (self.step + 1))
        if self.env.is_main:
            self.run_dir.drop_metrics_after(self.step)
        self._prime_ddp_buckets()
        onto = "" if before is None else f", resumed from {before} onto {self._shape().describe()}"
        log.info(
            "resumed from %s: step %d, epoch %d (+%d steps)%s", path, self.step, self.epoch, self.step_in_epoch, onto
        )

    def _from_mirror(self) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0, with no checkpoint in the run dir (purged, deleted, a new machine): the newest one the run's
        mirror holds (``trainer.mirror``), downloaded, checked against the mirror's ledger and named in the run
        dir's, then verified as any other; None, said plainly, when the mirror has none either."""
        url = self.cfg.trainer.mirror
        if not url:
            return None
        state = self.run_dir.mirror_state()
        # Steps trained, or a copy that landed: starting over would replace the mirror's story with a new one.
        ran_before = bool(self.run_dir.read_metrics() or (state is not None and state.landed))
        try:
            store = Store(url)
            ledger = read_ledger(store)
            if ledger is not None and not holds_this_run(ledger, self.run_dir, url):
                log.warning(
                    "no checkpoint in %s, and %s", self.run_dir.checkpoints, other_run(ledger, self.run_dir, url)
                )
                return None
            record = restore_newest(store, self.run_dir.checkpoints, ledger)
        except Exception as exc:  # the store's library: unreachable, no credentials, ...
            if ran_before:
                raise MirrorUnreadable(
                    f"{self.run_dir.checkpoints} holds no checkpoint, this run trained before, and its mirror {url} "
                    f"could not be read ({describe_error(exc)}). It does not start over, which would replace the "
                    "mirror's copies of it: the attempt fails (on Slurm, the supervisor tries once more). HINT: when the store "
                    "answers, launch the run dir again; to start over on purpose, launch it with trainer.mirror='' "
                    "or another mirror"
                ) from exc
            log.warning("mirror %s could not be read (%s): training starts from step 0", url, describe_error(exc))
            return None
        if record is None:
            say = log.warning if ran_before else log.info
            say("no checkpoint in %s nor in the mirror %s: training starts from step 0", self.run_dir.checkpoints, url)
            return None
        path = self.run_dir.checkpoints / Path(record.name).name
        self.checkpoints.adopt_copy(path, int(record.step or 0), record.sha256, record.size)
        log.warning(
            "no checkpoint in %s: resuming from the mirror %s, which holds %s (step %d), copied back and verified",
            self.run_dir.checkpoints,
            url,
            record.name,
            record.step,
        )
        return self.checkpoints.newest()

    def _shape(self) -> Shape:
        tc = self.cfg.trainer
        return Shape(
            nodes=self.env.world_size // self.env.local_world_size,
            tasks_per_node=self.env.local_world_size,
            batch_size=tc.batch_size,
            accumulate=self.accumulate,
        )

    def _written_by(self, path: Path, state: dict[str, Any]) -> str | None:
        """None when the checkpoint was written by as many ranks as this run has; else how it was laid out.
        Another rank count resumes when the global batch is the one the checkpoint was trained with (the
        launcher picks the split, ``launch.reshape``), since the data order follows the global sample count."""
        if state.get("world_size") == self.env.world_size:
            return None
        shape = state.get("shape")
        if not isinstance(shape, dict):  # written before checkpoints recorded their shape
            tc = state.get("config", {}).get("trainer", {})
            shape = {
                "world_size": state.get("world_size"),
                "global_batch": (state.get("world_size") or 0)
                * tc.get("batch_size", 0)
                * tc.get("accumulate_grad_batches", 1),
            }
        if shape.get("global_batch") != self.global_batch:
            raise ConfigError(
                f"{path} was written by {shape.get('world_size')} ranks with a global batch of "
                f"{shape.get('global_batch')}; this run has {self.env.world_size} ranks and a global batch of "
                f"{self.global_batch}. HINT: resume with a per-rank batch and accumulation that keep the global "
                "batch (python -m hpc_train picks them when only the shape changes), or start a new run directory"
            )
        if "nodes" in shape:
            return Shape(
                nodes=shape["nodes"],
                tasks_per_node=shape["tasks_per_node"],
                batch_size=shape["batch_size"],
                accumulate=shape["accumulate"],
            ).describe()
        return f"{shape.get('world_size')} ranks"

    def _check_same_data(self, path: Path, state: dict[str, Any]) -> None:
        """A synthetic image set changed with SYNTHETIC_VERSION 2: a run begun on the old one must not go on with
        the same config.yaml and other data."""
        images = self.cfg.data.dataset is None and len(self.cfg.data.input_shape) == 3
        if images and state.get("synthetic_version", 1) != SYNTHETIC_VERSION:
            raise ConfigError(
                f"{path} was trained on the synthetic images of an older hpc_train (white-noise class means); "
                "this version draws smooth ones, so resuming would go on with other data. HINT: start a new run "
                f"from its weights: leave hydra.run.dir unset and add trainer.init_from={self.run_dir.path}"
            )

    def _init_from(self) -> None:
        """A new run from the weights of an earlier one (trainer.init_from); every rank reads the same file."""
        source = self.cfg.trainer.init_from
        if not source:
            return
        path, weights = load_init_weights(Path(source).expanduser())
        try:
            result = self.raw_model.load_state_dict(weights, strict=False)
            problem = ""
            if result.missing_keys or result.unexpected_keys:
                problem = f"missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}"
        except RuntimeError as exc:  # a shape that differs
            problem = str(exc).splitlines()[-1].strip()[:300]
        if problem:
            raise ConfigError(
                f"trainer.init_from={source!r}: the weights in {path} do not fit this model ({problem}). HINT: use "
                "the same model config as the run that wrote them."
            )
        log.info("initialised the model from %s (weights only; optimizer and step start afresh)", path)

    def _prime_ddp_buckets(self) -> None:
        """Give a resumed DDP model the gradient-bucket layout the uninterrupted run has at this step.

        DDP all-reduces its first backward in buckets of parameter order, then rebuilds them in the order the
        gradients became ready. The layout sets the summation order of gloo's ring all-reduce, so resuming
        with the first-iteration layout would change the last bits of every later step. One forward and
        backward on a throwaway batch (random state, buffers and gradients restored afterwards) makes DDP
        rebuild before the first real step, as in the uninterrupted run.
        """
        wrapped = getattr(self.model, "_orig_mod", self.model)  # under the torch.compile wrapper, if any
        if not isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
            return
        rng = capture_rng(self.device)  # first: making a DataLoader iterator draws from the global generator
        loader = torch.utils.data.DataLoader(
            self.train_loader.dataset, batch_size=2, collate_fn=self.train_loader.collate_fn
        )
        inputs, targets = next(iter(loader))
        buffers = {k: v.clone() for k, v in self.raw_model.named_buffers()}
        with self.precision.autocast():
            loss = self.loss_fn(self.model(inputs.to(self.device)), targets.to(self.device))
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, buffer in self.raw_model.named_buffers():
                buffer.copy_(buffers[name])
        restore_rng(rng, self.device)

    def _save_weights(self, path: Any) -> None:
        save_atomic({k: v.detach().cpu().clone() for k, v in self.raw_model.state_dict().items()}, path)

    def _save_final(self) -> None:
        if self.env.is_main:
            self._save_weights(self.run_dir.model_final)
            log.info("saved %s", self.run_dir.model_final)
            self.observer.on_saved(self.step)  # the final weights keep every step

    def close(self) -> None:
        """Release files, the profiler and the progress bar; write the plots. Safe after a failure."""
        self.progress.close()
        self.metrics.close()
        self.telemetry.close()
        if self.stragglers is not None:
            self.stragglers.close()


def _progress_bar(total: int, shown: bool) -> tqdm[Any]:
    """Rank 0's progress bar. A bar redraws with carriage returns: only where a terminal shows it, not in piped
    or batch logs."""
    return tqdm(
        total=total,
        desc="train",
        unit="step",
        disable=not (shown and shows_progress_bar()),
        file=sys.stderr,
        mininterval=1.0,
        dynamic_ncols=False,
        ncols=110,
    )


def binding_limit(tc: TrainerConfig, steps_per_epoch: int) -> str:
    """Which of trainer.max_steps and the epoch limit ends the run, in words for the start-up line."""
    by_epochs = tc.epoch_limit * steps_per_epoch
    if tc.max_steps and (not by_epochs or tc.max_steps <= by_epochs):
        bound = f"trainer.max_steps={tc.max_steps} binds"
        return bound if not tc.epoch_limit else f"{bound}, before {tc.epoch_limit} epochs"
    epochs = f"trainer.max_epochs={tc.epoch_limit} binds"
    if tc.max_epochs is None:
        epochs = f"{tc.epoch_limit} epochs (the default) bind"
    return epochs if not tc.max_steps else f"{epochs}, before trainer.max_steps={tc.max_steps}"


def checkpoint_policy(tc: TrainerConfig) -> str:
    """What a crash costs under the periodic checkpoints in force, in words for the start-up log."""
    every = [f"every {tc.checkpoint_every_min:g} min"] if tc.checkpoint_every_min else []
    every += [f"every {tc.checkpoint_every_n_steps} steps"] if tc.checkpoint_every_n_steps else []
    if not every:
        return (
            "no periodic checkpoints (trainer.checkpoint_every_min=0): a crash or a lost node costs all the training "
            "of this attempt; a stop signal still checkpoints"
        )
    return f"checkpoints {' and '.join(every)}: a crash or a lost node costs at most that much training"


def _shown(key: str, value: Any) -> str:
    """A metrics row value for the log line: a timestamp (``*_at``) as the time of day, floats to 4 digits."""
    if key.endswith("_at") and isinstance(value, float):
        return time.strftime("%H:%M:%S", time.localtime(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)
