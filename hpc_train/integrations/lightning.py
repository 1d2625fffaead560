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

Exact resume mid-epoch needs a dataloader that saves its position: ``torchdata.stateful_dataloader.
StatefulDataLoader`` (Lightning stores and restores its state). A plain ``DataLoader`` restarts the epoch's
batches, so some batches are seen twice. Lightning stores no RNG state: seed dropout and the like per step
if they must replay exactly. A stop at Lightning's epoch end runs the validation it does when training is
stopped early, after the checkpoint is written, and loggers record the run as "failed" (Lightning's word for
an exit during ``fit``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from hpc_train.core.errors import ConfigError, DistEnvironmentError
from hpc_train.integrations import newest
from hpc_train.runtime import preemption

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


class PreemptionCallback(pl.Callback):
    """Stop together on preemption, checkpoint, and exit so that hpc_train requeues the job.

    ``exit_after_stop=False`` lets ``fit()`` return instead (``hpc_train.preemption.stop_signal()`` is then
    non-zero); the script must then return without training further, and exit 0.
    """

    def __init__(self, exit_after_stop: bool = True) -> None:
        self.exit_after_stop = exit_after_stop
        self.stopped = False
        self._last_step: int | None = None
        self._deferred = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        _check_shape(trainer)
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        preemption.reclaim_signals()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.stopped or step == self._last_step:  # no optimizer step (gradient accumulation): no agreement
            return
        self._last_step = step
        if not preemption.should_stop(step):
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and not self._deferred:
            # A checkpoint taken at an epoch's last batch resumes, in Lightning 2.x, with that epoch's spent data
            # iterator and skips the next epoch. So the stop waits one step, into the next epoch, and is saved
            # there: one more step is trained (not redone) before the checkpoint.
            self._deferred = True
            return
        self.stopped = True
        self._save(trainer, step)
        # Lightning ignores should_stop until min_steps / min_epochs are reached: this stop must not wait.
        trainer.fit_loop.min_epochs = None
        trainer.fit_loop.epoch_loop.min_steps = None
        trainer.should_stop = True

    @staticmethod
    def _save(trainer: pl.Trainer, step: int) -> None:
        final = checkpoint_path(trainer.default_root_dir, step)
        partial = final.with_name(f".hpc_train_saving_{step}")
        trainer.save_checkpoint(partial)  # collective, ending in a barrier: the file is whole when it returns
        if trainer.is_global_zero:
            os.replace(partial, final)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stopped and self.exit_after_stop:
            raise SystemExit(0)
