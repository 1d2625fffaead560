"""Preemption for the Hugging Face ``Trainer``: ``PreemptionCallback`` and ``last_checkpoint``.

    from hpc_train.integrations.transformers import PreemptionCallback, last_checkpoint

    trainer = Trainer(model, args, train_dataset=..., callbacks=[PreemptionCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

On a stop signal (``cluster.signal``, SIGTERM, SIGINT) every rank agrees at the next optimizer step; the Trainer
then writes its own complete checkpoint (``checkpoint-<step>``: model, optimizer, scheduler, every rank's RNG
state, trainer state), whatever ``save_strategy`` says (``"no"`` included), and training stops. The callback
marks the checkpoint complete once every rank has written its part, and ends the script with status 0 at the
end of ``train()``, before the code after it runs (a final save or a push to the Hub would save a model that
is not final): hpc_train requeues the job and the relaunched script resumes at the agreed step.

On CPU the Trainer is distributed only with ``TrainingArguments(use_cpu=True, ddp_backend="gloo")``; without them
every rank trains its own copy of the model, and the callback warns at the start of training.

What the stop skips, by design: an evaluation due at that step (it would delay the checkpoint past the grace
period Slurm gives) and the epoch-end save and evaluation of a stopped epoch. What it cannot restore: the
Trainer logs ``train_loss`` as the mean over the steps of the last attempt only.

Experiment trackers (``report_to=["mlflow"]``, ``["wandb"]``, ``["tensorboard"]``, with hpc_train's
``tracking.*``): after a crash the script resumes from its last checkpoint and trains the steps since then
again. The rows of those steps are already in the run dir's tracker run, so the callback keeps the reporting
callbacks from sending them twice: on rank 0, from the end of such a step to the start of the next, the
Trainer's state says it is not the main process, which every reporting callback checks before it logs. (The
Trainer still keeps the rows in its own ``log_history``.) Rank 0 records each step it reports
(``hpc_train.preemption.trackers_hold``).

A global batch kept on any node count (``script.global_batch``, issue 55): with it, the callback sets the
Trainer's ``gradient_accumulation_steps`` when the Trainer is built (before its loader is), so that the script's
``per_device_train_batch_size`` x the ranks it has today x the accumulation is ``script.global_batch`` whatever
nodes the queue gave, and says so on rank 0. The Trainer's own data path then keeps the order: its sampler is one
permutation per seed and epoch on every rank, which accelerate deals out batch by batch, so global step t trains
on the same samples on any rank count, and a resume skips exactly the steps done. A per-device batch that does
not divide ``script.global_batch / ranks`` cannot be changed once the Trainer is built (its loader's batch size
is fixed in its constructor), so the callback ends the script with a ConfigError that says what would: call
``keep_global_batch(args)`` before building the Trainer, which sets the per-device batch too where the
accumulation alone cannot make the global batch (the largest batch below the script's that divides the rank's
share, as the built-in trainer does). The order stays the same with another per-device batch: a step still
covers the same positions of the permutation. Each rank's RNG state is restored where its file exists (ranks
that did not exist start from the seed).

Stragglers (``cluster.stragglers``): hpc_train times each rank's DDP model and names a slow one in its log,
``status/`` and ``jobs status`` with no callback at all. With the callback, rank 0 also logs the figures of each
verdict into the Trainer's MLflow run (at the step just logged) and W&B run (with its next row):
``stragglers/slowest_x_median``, ``stragglers/count`` and ``stragglers/node/<host>``. Other reporters
(TensorBoard, ...) do not get them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from hpc_train.core.batch import GLOBAL_BATCH_VARIABLE
from hpc_train.integrations import newest
from hpc_train.runtime import preemption
from hpc_train.runtime.global_batch import GlobalBatch
from hpc_train.runtime.script_clock import TrackerFigures, log_to_active_trackers

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as exc:  # pragma: no cover - depends on the user's environment
    raise ImportError(
        "hpc_train.integrations.transformers needs transformers and accelerate: pip install 'hpc-train[transformers]'"
    ) from exc

__all__ = ["COMPLETE", "PreemptionCallback", "keep_global_batch", "last_checkpoint"]

COMPLETE = "hpc_train_complete"
"""Written into a checkpoint folder once every rank has saved its part of it."""


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest complete ``checkpoint-<step>`` under ``output_dir``, or None (start from scratch).

    Complete: marked by the callback once every rank had saved; a folder without the mark (written by a run
    without the callback) counts when it has the Trainer's own last file, ``trainer_state.json``, and no
    folder has a mark.
    """
    pattern = rf"{PREFIX_CHECKPOINT_DIR}-(\d+)"
    return newest(output_dir, pattern, COMPLETE) or newest(output_dir, pattern, "trainer_state.json")


def _warn_if_not_distributed(args: TrainingArguments) -> None:
    """Warn when the environment has several ranks (``WORLD_SIZE``) but the Trainer runs as a single process:
    on CPU, without ``use_cpu=True``, accelerate sets up no distributed training and each rank trains alone."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1 and args.world_size != ranks:
        warnings.warn(
            f"WORLD_SIZE={ranks}, but the Hugging Face Trainer runs {args.world_size} process(es) "
            f"(parallel_mode={args.parallel_mode.value}): each rank trains its own identical copy of the model. "
            'HINT: on CPU pass TrainingArguments(use_cpu=True, ddp_backend="gloo"); on GPUs check that '
            "torch.distributed is initialised (LOCAL_RANK set, one GPU per rank).",
            RuntimeWarning,
            stacklevel=2,
        )


_kept: dict[int, tuple[int, int]] = {}
"""The per-device batch and accumulation ``keep_global_batch`` set, by the arguments' id: the callback, which
checks them again when the Trainer is built, does not say them twice."""


def keep_global_batch(args: TrainingArguments) -> TrainingArguments:
    """``script.global_batch`` on today's ranks, set on ``args`` (and returned) before the Trainer is built: the
    script's per-device batch and accumulation where they make it, else the accumulation, else a smaller
    per-device batch as well (``hpc_train.core.batch.split_global_batch``). Rank 0 says what changed. Without
    ``script.global_batch`` (or outside hpc_train) ``args`` stay as they are.

        args = keep_global_batch(TrainingArguments(..., per_device_train_batch_size=16))
        trainer = Trainer(model, args, ..., callbacks=[PreemptionCallback()])
    """
    if not os.environ.get(GLOBAL_BATCH_VARIABLE):
        return args
    per_device, was = args.per_device_train_batch_size, args.gradient_accumulation_steps
    batch = GlobalBatch.of(per_rank=per_device, accumulate=was, steps=_steps(args))
    args.per_device_train_batch_size, args.gradient_accumulation_steps = batch.per_rank, batch.accumulate
    _kept[id(args)] = (batch.per_rank, batch.accumulate)
    _say(
        batch,
        [
            ("per_device_train_batch_size", per_device, batch.per_rank),
            ("gradient_accumulation_steps", was, batch.accumulate),
        ],
    )
    return args


def _keep_global_batch(args: TrainingArguments) -> None:
    """``script.global_batch`` on today's ranks: the accumulation that makes it with the script's per-device batch
    (module docstring), set on ``args`` when the Trainer has been built, before it builds its loader."""
    per_device, was = args.per_device_train_batch_size, args.gradient_accumulation_steps
    batch = GlobalBatch.accumulating(
        per_device,
        was,
        _steps(args),
        batch_key="per_device_train_batch_size",
        other_fix="call hpc_train.integrations.transformers.keep_global_batch(args) before building the Trainer "
        "(it sets the per-device batch as well)",
    )
    args.gradient_accumulation_steps = batch.accumulate
    if (per_device, was) != _kept.get(id(args)):  # (keep_global_batch said it already)
        _say(batch, [("gradient_accumulation_steps", was, batch.accumulate)])


def _steps(args: TrainingArguments) -> int | None:
    """The optimizer steps the Trainer trains in all (``max_steps``), which the growth estimate weighs."""
    return args.max_steps if args.max_steps > 0 else None


def _say(batch: GlobalBatch, changes: list[tuple[str, int, int]]) -> None:
    """Rank 0's line: the global batch, and each argument's old and new value."""
    if batch.rank == 0:
        told = ", ".join(f"{key} {was} -> {now}" for key, was, now in changes)
        print(f"hpc_train: {batch.describe()} ({told})", flush=True)


class PreemptionCallback(TrainerCallback):
    """Stop together on preemption, checkpoint, and exit so that hpc_train requeues the job.

    ``exit_after_stop=False`` lets ``train()`` return instead (``hpc_train.preemption.stop_signal()`` is then
    non-zero); the script must then return without training further, and exit 0.
    """

    def __init__(self, exit_after_stop: bool = True) -> None:
        self.exit_after_stop = exit_after_stop
        self.stopped = False
        self._checked_world = False
        self._main = False
        """Rank 0, as the Trainer said at the start of training (its state's flag is lowered while muted)."""
        self._held: int | None = None
        """The latest step the run dir's tracker runs hold from an earlier attempt (None: none)."""
        self._muted = False
        self._stragglers = TrackerFigures()
        """Rank 0: the straggler figures of its worker's verdicts, for the MLflow and W&B runs the Trainer logs to."""

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if os.environ.get(GLOBAL_BATCH_VARIABLE):
            _keep_global_batch(args)
        return control

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if not self._checked_world:
            self._checked_world = True
            _warn_if_not_distributed(args)
        self._main = state.is_world_process_zero
        self._held = preemption.trackers_hold() if self._main else None
        return control

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._unmute(state)
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        if self._main and not self._muted and preemption.tracker_run_ids():
            preemption.trackers_hold(state.global_step)  # the reporting callbacks, before this one, sent it
        if self._main and not self._muted:
            figures = self._stragglers.new()
            if figures:  # the reporting callbacks have sent this row: MLflow at its step, W&B in the next row
                log_to_active_trackers(figures, state.global_step)
        return control

    def _unmute(self, state: TrainerState) -> None:
        if self._muted:
            state.is_world_process_zero = True
            self._muted = False

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self._held is not None and state.global_step <= self._held and self._main:
            # A step trained again after a crash: its rows (and its evaluation's) are in the trackers already.
            state.is_world_process_zero = False
            self._muted = True
        if self.stopped or not preemption.should_stop(state.global_step):
            return control
        self.stopped = True
        # A complete checkpoint whatever the user chose: optimizer, scheduler and RNG states included.
        args.save_only_model = False
        control.should_save = True
        control.should_evaluate = False
        control.should_training_stop = True
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        # Every rank has written its files (each writes its own RNG state) once all are past the barrier.
        preemption.wait_for_all()
        folder = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self._main and folder.is_dir():
            (folder / COMPLETE).write_text(f"{state.global_step}\n")
        return control

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.stopped:  # the checkpoint of this step is written: no second save, no evaluation
            control.should_save = False
            control.should_evaluate = False
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._unmute(state)
        if self.stopped and self.exit_after_stop:
            raise SystemExit(0)
        return control
