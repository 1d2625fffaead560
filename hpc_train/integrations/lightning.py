"""Preemption for Lightning: ``PreemptionCallback``, ``last_checkpoint`` and ``trainer_shape``.

    from hpc_train.integrations.lightning import PreemptionCallback, last_checkpoint, trainer_shape

    trainer = L.Trainer(**trainer_shape(), strategy="ddp", default_root_dir=out, callbacks=[PreemptionCallback()])
    trainer.fit(model, datamodule, ckpt_path=last_checkpoint(out))

``trainer_shape()`` gives Lightning the ranks hpc_train (or torchrun) started: ``devices`` = LOCAL_WORLD_SIZE and
``num_nodes`` = WORLD_SIZE // LOCAL_WORLD_SIZE. Under such a launcher the callback refuses a Trainer of another
shape when it is set up: one that expects fewer ranks would train a copy of the model per rank. (One that expects
more waits for them in Lightning's rendezvous, before any callback runs; ``devices="auto"`` on CPU fails in
Lightning itself.)

On a stop signal (``cluster.signal``, SIGTERM, SIGINT) every rank agrees at the next optimizer step; the
callback has Lightning write a complete checkpoint, ``hpc_ckpt_<step>.ckpt`` in ``default_root_dir`` (written
under a temporary name and renamed once Lightning's save, a collective, has returned, so a half-written file
is never picked), stops training, and ends the script with status 0 at the end of ``fit()``: hpc_train requeues the job. Lightning's
own SLURM resume also finds ``hpc_ckpt_*`` files, so under Slurm even ``ckpt_path=None`` resumes; local runs
need the ``last_checkpoint`` line. Use a ``default_root_dir`` of this run only.

Lightning's own preemption handling is switched off while the callback is in use: its SLURM auto-requeue
(checkpoint I/O and ``scontrol requeue`` inside a signal handler, decided by rank 0 alone) and its SIGTERM
handler (a broadcast inside the handler). Our flag-only handlers are put back at the start of training.

Exact resume mid-epoch: the checkpoint also holds every rank's random state (torch, CUDA, numpy, Python),
put back just before the first resumed batch, and the number of batches the epoch had trained. A
``DataLoader`` whose order is a function of the epoch (a ``DistributedSampler``, which Lightning puts in under
DDP, or scvi-tools' ``BatchDistributedSampler``) continues the epoch at the next batch: the batches already
trained are skipped in the sampler, without loading them. A ``StatefulDataLoader`` restores its own position.
A loader shuffled from the global RNG (``shuffle=True`` on one rank) draws another order. A stop at Lightning's
epoch end runs the validation it does when training is stopped early, after the checkpoint is written, and
loggers record the run as "failed" (Lightning's word for an exit during ``fit``). A logger that keeps its
history in memory (scvi-tools' ``model.history``) gets the earlier attempts' rows back on resume.

Any node count (``script.global_batch``, for a node range, growth, a lost node or a run dir resumed on another
node count): the callback sets ``accumulate_grad_batches`` at the start of training so that the train loader's
batch x today's ranks x the accumulation is the global batch (a ConfigError where the batch does not divide
today's share). Every checkpoint written while fitting records the rank count and accumulation it was written
with; resumed on another rank count, the epoch loop's micro-batch counts are rescaled to today's accumulation
and the epoch's trained batches skipped in the sampler, a ``StatefulDataLoader``'s own saved position set
aside. With a ``DistributedSampler`` over a data set of whole global batches, every step then trains on the
samples it would have on the full shape; each rank's random state starts afresh.

Stragglers (``cluster.stragglers``): hpc_train times each rank's DDP model and names a slow one in its log,
``status/`` and ``jobs status`` with no callback at all. With the callback, rank 0 also logs each verdict's
figures (``stragglers/slowest_x_median``, ``stragglers/count``, ``stragglers/node/<host>``) to Lightning's own
loggers at the step it arrives.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict

import torch

from hpc_train.core.batch import GLOBAL_BATCH_VARIABLE
from hpc_train.core.errors import ConfigError, DistEnvironmentError
from hpc_train.integrations import newest
from hpc_train.runtime import preemption
from hpc_train.runtime.global_batch import GlobalBatch
from hpc_train.runtime.script_clock import TrackerFigures

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
except ImportError as exc:  # pragma: no cover - depends on the user's environment
    raise ImportError("hpc_train.integrations.lightning needs lightning: pip install 'hpc-train[lightning]'") from exc

__all__ = ["PreemptionCallback", "TrainerShape", "checkpoint_path", "last_checkpoint", "trainer_shape"]


class TrainerShape(TypedDict):
    """Keyword arguments of ``L.Trainer``: typed per key, so that ``**trainer_shape()`` type-checks."""

    devices: int
    num_nodes: int


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    """Where the callback saves at ``step``: Lightning's own ``hpc_ckpt_<n>.ckpt`` naming."""
    return Path(directory) / f"hpc_ckpt_{step}.ckpt"


def last_checkpoint(directory: str | os.PathLike[str]) -> str | None:
    """The newest ``hpc_ckpt_<step>.ckpt`` in ``directory``, or None (start from scratch)."""
    return newest(directory, r"hpc_ckpt_(\d+)\.ckpt")


def trainer_shape(environ: Mapping[str, str] | None = None) -> TrainerShape:
    """``devices`` and ``num_nodes`` for ``L.Trainer(**trainer_shape(), ...)``: one Lightning process per rank that
    hpc_train (or torchrun) started, read from WORLD_SIZE and LOCAL_WORLD_SIZE (``os.environ`` by default).
    Without WORLD_SIZE (a plain ``python script.py``), one process: ``devices=1, num_nodes=1``."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return {"devices": 1, "num_nodes": 1}
    if "LOCAL_WORLD_SIZE" not in environ:
        raise DistEnvironmentError(
            f"WORLD_SIZE={environ['WORLD_SIZE']} is set but LOCAL_WORLD_SIZE is not: the ranks per node are unknown. "
            "HINT: launch with hpc_train or torchrun, which set both."
        )
    world, per_node = int(environ["WORLD_SIZE"]), int(environ["LOCAL_WORLD_SIZE"])
    if per_node < 1 or world % per_node:
        raise DistEnvironmentError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={per_node}: ranks per node must be equal."
        )
    return {"devices": per_node, "num_nodes": world // per_node}


def _check_shape(trainer: pl.Trainer) -> None:
    """Refuse a Trainer whose devices x num_nodes is not the ranks that hpc_train (or torchrun) started. Processes
    that Lightning starts itself have no LOCAL_WORLD_SIZE: nothing to check against."""
    if "WORLD_SIZE" not in os.environ or "LOCAL_WORLD_SIZE" not in os.environ:
        return
    expected = trainer_shape()
    actual = TrainerShape(devices=trainer.num_devices, num_nodes=trainer.num_nodes)
    if actual != expected:
        raise ConfigError(
            f"the Lightning Trainer has devices={actual['devices']}, num_nodes={actual['num_nodes']}, but this job "
            f"runs devices={expected['devices']}, num_nodes={expected['num_nodes']} (WORLD_SIZE="
            f"{os.environ['WORLD_SIZE']}, LOCAL_WORLD_SIZE={os.environ['LOCAL_WORLD_SIZE']}): "
            "the ranks would not train one model together. HINT: L.Trainer(**trainer_shape(), ...) "
            "with trainer_shape from hpc_train.integrations.lightning, or "
            'devices=int(os.environ["LOCAL_WORLD_SIZE"]), '
            'num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]).'
        )


class Stopped(SystemExit):
    """How the callback ends a stopped script: exit status 0 (requeue me), with a message that says so to a
    framework that catches and prints it (scvi-tools prints every exception out of ``fit``)."""

    def __init__(self, step: int, path: Path) -> None:
        super().__init__(0)
        self.step, self.path = step, path

    def __str__(self) -> str:
        return f"hpc_train: stopped on a signal at step {self.step}, saved {self.path}; exiting 0 to be requeued"


class PreemptionCallback(pl.Callback):
    """Stop together on preemption, checkpoint, and exit so that hpc_train requeues the job; resume exactly.

    ``exit_after_stop=False`` lets ``fit()`` return instead (``hpc_train.preemption.stop_signal()`` is then
    non-zero); the script must then return without training further, and exit 0.
    """

    def __init__(self, exit_after_stop: bool = True) -> None:
        self.exit_after_stop = exit_after_stop
        self.stopped = False
        self.saved: Path | None = None
        self._last_step: int | None = None
        self._deferred = False
        self._saving: dict[str, Any] = {}
        self._trainer: pl.Trainer | None = None
        self._resume: dict[str, Any] = {}
        self._random_pending: dict[str, Any] | None = None
        self._by_skip = False
        """The resumed epoch's loaders are positioned by skipping in their samplers, their own saved state set aside."""
        self._skipped_epoch: int | None = None
        """The epoch whose loaders this attempt positioned by skipping (their own state then counts from the skip)."""
        self._stragglers = TrackerFigures()
        """Rank 0: the straggler figures of its worker's verdicts, for Lightning's own loggers."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        _check_shape(trainer)
        self._trainer = trainer
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False

    # ---- what a checkpoint holds beyond Lightning's own -------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """In every checkpoint written while fitting (the stop's, and any ModelCheckpoint's): the shape it was
        written on, so that a resume on another rank count keeps the data order; in the stop's also every rank's
        random state and the in-memory history."""
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit":
            return dict(self._saving)
        return {
            "world": trainer.world_size,
            "epoch": trainer.current_epoch,
            "batches": int(trainer.fit_loop.epoch_loop.batch_progress.current.processed),  # of this epoch, trained
            "accumulate": int(trainer.accumulate_grad_batches),
            "skipped": self._skipped_epoch == trainer.current_epoch,
            **self._saving,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume = dict(state_dict)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Before Lightning restores its loops: a checkpoint with this callback's state resumed on another rank
        count (or one whose epoch was positioned by skipping) sets the loaders' own saved state aside, since it
        counts another shape's batches (or those after the skip); the resumed epoch is then positioned by
        skipping, in ``on_train_start``."""
        saved = checkpoint.get("callbacks", {}).get(self.state_key, {})
        then = _written_by(saved)
        if then is None:
            return
        self._by_skip = then != trainer.world_size or bool(saved.get("skipped"))
        if self._by_skip:
            fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
            fit_loop.get("state_dict", {}).pop("combined_loader", None)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        preemption.reclaim_signals()
        if os.environ.get(GLOBAL_BATCH_VARIABLE):
            _keep_global_batch(trainer)
        resume, self._resume = self._resume, {}
        then, world = _written_by(resume), trainer.world_size
        if then is None:  # a checkpoint without this callback's state: Lightning's own resume
            return
        stop = "random" in resume
        if trainer.is_global_zero and stop:
            _restore_history(trainer, resume.get("history", {}))
        batches = int(resume["batches"])
        which = "stop checkpoint" if stop else "checkpoint"
        if then == world:
            if not stop and not self._by_skip:  # Lightning's own resume, as on one shape
                return
            if stop:
                self._random_pending = resume["random"][trainer.global_rank]
        elif os.environ.get(GLOBAL_BATCH_VARIABLE) and "accumulate" in resume:
            batches = _rescale_batches(trainer, batches, int(resume["accumulate"]))
            _warn(
                trainer,
                f"the {which} was written by {then} ranks and {world} resume it, with the same global "
                "batch and data order: each rank's random state (dropout, augmentations) starts afresh",
            )
        else:
            _warn(
                trainer,
                f"the {which} was written by {then} ranks and {world} resume it: the random state and the "
                "rest of the epoch start afresh",
            )
            return
        if trainer.current_epoch == resume["epoch"]:
            _skip_trained_batches(trainer, batches, stateful_too=self._by_skip)
            self._skipped_epoch = trainer.current_epoch if self._by_skip else None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._random_pending is not None:  # the first resumed batch: the state its twin saw, uninterrupted
            _set_random_state(self._random_pending)
            self._random_pending = None

    # ---- the stop --------------------------------------------------------------------------------------------

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.stopped or step == self._last_step:  # no optimizer step (gradient accumulation): no agreement
            return
        self._last_step = step
        if trainer.is_global_zero:
            _log_stragglers(trainer, self._stragglers.new(), step)
        if not preemption.should_stop(step):
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and not self._deferred:
            # A checkpoint taken at an epoch's last batch resumes, in Lightning 2.x, with that epoch's spent data
            # iterator and skips the next epoch. So the stop waits one step, into the next epoch, and is saved
            # there: one more step is trained (not redone) before the checkpoint.
            self._deferred = True
            return
        self.stopped = True
        self._saving = {
            "batches": batch_idx + 1,  # of this epoch, trained
            "random": _gather(trainer, _random_state()),
            "history": _history(trainer),
        }
        try:
            self.saved = self._save(trainer, step)
        finally:
            self._saving = {}
        # Lightning ignores should_stop until min_steps / min_epochs are reached: this stop must not wait.
        trainer.fit_loop.min_epochs = None
        trainer.fit_loop.epoch_loop.min_steps = None
        trainer.should_stop = True

    @staticmethod
    def _save(trainer: pl.Trainer, step: int) -> Path:
        final = checkpoint_path(trainer.default_root_dir, step)
        partial = final.with_name(f".hpc_train_saving_{step}")
        trainer.save_checkpoint(partial)  # collective, ending in a barrier: the file is whole when it returns
        if trainer.is_global_zero:
            os.replace(partial, final)
        return final

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stopped and self.exit_after_stop:
            raise Stopped(trainer.global_step, self.saved or checkpoint_path(trainer.default_root_dir, 0))


def _written_by(saved: Mapping[str, Any]) -> int | None:
    """The rank count a checkpoint was written on, from this callback's state in it (None: it has none)."""
    if "world" in saved:
        return int(saved["world"])
    return len(saved["random"]) if "random" in saved else None  # a stop checkpoint of an earlier version


def _log_stragglers(trainer: pl.Trainer, figures: Mapping[str, float], step: int) -> None:
    """A new straggler verdict's figures, at ``step``, to each of Lightning's own loggers (MLflow, W&B,
    TensorBoard, CSV, ...): trackers. A logger of another package (scvi-tools' history) is the user's own
    record, and is left as it is."""
    if not figures:
        return
    for logger in trainer.loggers:
        if type(logger).__module__.startswith("lightning.pytorch.loggers"):
            logger.log_metrics(dict(figures), step=step)


def _warn(trainer: pl.Trainer, message: str) -> None:
    if trainer.is_global_zero:
        print(f"hpc_train: warning: {message}", flush=True)


def _random_state() -> dict[str, Any]:
    """This process's random state, in types a weights-only ``torch.load`` reads back."""
    # numpy only for a random state to save or restore
    import numpy as np

    kind, keys, position, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": [
            str(kind),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(position),
            int(has_gauss),
            float(gauss),
        ],
        "python": [list(item) if isinstance(item, tuple) else item for item in random.getstate()],
    }


def _set_random_state(state: Mapping[str, Any]) -> None:
    # numpy only for a random state to save or restore
    import numpy as np

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _gather(trainer: pl.Trainer, mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order, on every rank (a collective)."""
    # torch.distributed only for a gather across ranks
    import torch.distributed as dist

    if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def _history(trainer: pl.Trainer) -> dict[str, Any]:
    """A logger's in-memory history (scvi-tools' ``SimpleLogger``: one DataFrame per metric), as plain lists."""
    history = getattr(trainer.logger, "history", None) if trainer.is_global_zero else None
    if not isinstance(history, Mapping):
        return {}
    kept = {}
    for metric, frame in history.items():
        if hasattr(frame, "index") and hasattr(frame, "to_numpy"):
            kept[str(metric)] = {
                "index_name": frame.index.name,
                "index": [_plain(i) for i in frame.index],
                "values": [_plain(v) for v in frame.to_numpy().reshape(-1)],
            }
    return kept


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _restore_history(trainer: pl.Trainer, saved: Mapping[str, Any]) -> None:
    """Put the earlier attempts' rows back into a logger that keeps its history in memory."""
    experiment = getattr(trainer.logger, "experiment", None)
    data = getattr(experiment, "data", None)
    if not saved or not isinstance(data, dict):
        return
    # pandas only for a logger that keeps a DataFrame (scvi-tools' history)
    import pandas as pd

    for metric, rows in saved.items():
        frame = pd.DataFrame({metric: rows["values"]}, index=pd.Index(rows["index"], name=rows["index_name"]))
        data[metric] = frame if metric not in data else pd.concat([frame, data[metric]])


class _SkipFirst:
    """A data loader's (batch) sampler whose next pass skips its first ``n`` items, once: the batches of the
    resumed epoch that were trained before the stop. Everything else (``len``, ``set_epoch``) is the sampler's."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n = inner, n

    def __iter__(self) -> Iterator[Any]:
        n, self.n = self.n, 0
        return itertools.islice(iter(self.inner), n, None)

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _keep_global_batch(trainer: pl.Trainer) -> None:
    """``script.global_batch`` on today's ranks: the ``accumulate_grad_batches`` that makes it with the train
    loader's own batch size, set before the first batch (as Lightning's ``GradientAccumulationScheduler`` does)."""
    fit_loop = trainer.fit_loop
    loaders = fit_loop._combined_loader.flattened if fit_loop._combined_loader is not None else []
    sizes = {_batch_size(loader) for loader in loaders}
    if len(sizes) != 1 or None in sizes:
        raise ConfigError(
            f"script.global_batch={os.environ[GLOBAL_BATCH_VARIABLE]} needs one train DataLoader with a batch_size "
            f"to split it by, and this Trainer trains on {len(loaders)} loader(s) with batch sizes "
            f"{sorted(sizes, key=str)}. HINT: give the train DataLoader a batch_size, or drop script.global_batch "
            "(and cluster.min_nodes)"
        )
    (per_rank,) = sizes
    assert per_rank is not None
    was = int(trainer.accumulate_grad_batches)
    steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    batch = GlobalBatch.accumulating(per_rank, was, steps, batch_key="the train DataLoader's batch_size")
    trainer.accumulate_grad_batches = batch.accumulate
    if trainer.is_global_zero:
        print(f"hpc_train: {batch.describe()} (accumulate_grad_batches {was} -> {batch.accumulate})", flush=True)


def _batch_size(loader: Any) -> int | None:
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) else None


def _rescale_batches(trainer: pl.Trainer, batches: int, accumulated: int) -> int:
    """A checkpoint written with ``accumulated`` micro-batches a step, resumed with today's accumulation: the
    epoch loop's batch counts, in micro-batches, become today's for the same optimizer steps (Lightning steps the
    optimizer when the count is a multiple of the accumulation). Returns ``batches``, the resumed epoch's batches
    done, in today's."""
    now = int(trainer.accumulate_grad_batches)

    def rescaled(done: int) -> int:
        return done // accumulated * now + done % accumulated

    progress = trainer.fit_loop.epoch_loop.batch_progress
    for tracker in (progress.total, progress.current):
        ready = tracker.ready  # the others lag it by the stages a batch had not finished at the save
        for name in ("started", "processed", "completed", "ready"):
            setattr(tracker, name, rescaled(ready) - (ready - getattr(tracker, name)))
    return rescaled(batches)


def _skip_trained_batches(trainer: pl.Trainer, batches: int, stateful_too: bool = False) -> None:
    """Continue the resumed epoch at its next batch. Lightning counts the batches already trained, but draws them
    again from a fresh iterator; here the train loaders' samplers skip them instead, in the order of this epoch
    (set first: Lightning sets it only after this hook), and the iterators are made anew. A stateful loader
    restores its own position, unless ``stateful_too`` (its saved state was set aside: ``on_load_checkpoint``)."""
    # Lightning's private helpers, only when a resumed epoch skips its trained batches
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from lightning.fabric.utilities.types import _Stateful
    from torch.utils.data import DataLoader, IterableDataset

    fit_loop = trainer.fit_loop
    loaders = fit_loop._combined_loader.flattened if fit_loop._combined_loader is not None else []
    skipped = False
    for loader in loaders:
        if not isinstance(loader, DataLoader) or (isinstance(loader, _Stateful) and not stateful_too):
            continue  # a stateful loader restores its own position
        if isinstance(loader.dataset, IterableDataset):
            continue  # its order is the dataset's own: no sampler to skip in
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        object.__setattr__(loader, attribute, _SkipFirst(getattr(loader, attribute), batches))
        _set_sampler_epoch(loader, trainer.current_epoch)
        skipped = True
    if skipped and fit_loop._data_fetcher is not None:
        iter(fit_loop._data_fetcher)  # iterators over the wrapped samplers
