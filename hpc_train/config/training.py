"""The groups of the built-in training job: ``data`` (the synthetic set, or your own) and ``trainer`` (the loop,
with its learning-rate schedule, early stopping and DDP options)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hpc_train.config.checks import (
    F32,
    FLOAT32_MAX,
    INT32_MAX,
    INT64_MAX,
    YEAR_MIN,
    YEAR_S,
    Checked,
    check_target,
    control_character,
)

MIRROR_URL = re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s]")
"""A store's URL: a scheme, then the bucket or host (``s3://bucket/prefix``)."""
HOOK = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
"""``module.function``: what trainer.mirror_hook names."""

__all__ = [
    "DEVICES",
    "LR_SCALING",
    "PRECISIONS",
    "SCHEDULES",
    "STRATEGIES",
    "DDPConfig",
    "DataConfig",
    "EarlyStoppingConfig",
    "ScheduleConfig",
    "TrainerConfig",
]

LR_SCALING = ("none", "linear", "sqrt")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "dp", "single")
SCHEDULES = ("constant", "cosine", "step")


@dataclass
class DataConfig(Checked):
    """A synthetic classification set: class-conditional Gaussians (a random mean per class, unit noise)."""

    _group: ClassVar[str] = "data"

    name: str = "synthetic"
    """Data set kind; only ``synthetic`` is built in."""
    num_samples: int = 32768
    """Samples in train + validation together."""
    input_shape: list[int] = field(default_factory=lambda: [784])
    """Shape of one input, e.g. [784] or [3, 32, 32]."""
    num_classes: int = 10
    """Number of classes."""
    seed: int = 0
    """Seed of the data itself (class means, samples, split), independent of the trainer's seed."""
    val_fraction: float = 0.1
    """Share of samples held out for validation."""
    class_separation: float = 3.0
    """Norm of each class mean against unit noise: larger is easier (about 0.9 accuracy at 3 with 10 classes)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0 loads in the training process)."""
    pin_memory: bool | None = None
    """Page-locked host batches for faster copies to the GPU (None: on when training on CUDA)."""
    on_device: bool | None = None
    """Keep the data set in the device's memory and gather each batch there, instead of a DataLoader copying
    it over batch by batch. For in-memory tensor sets only (the synthetic set, or a ``TensorDataset`` from
    ``data.dataset``), without workers. None: on when training on CUDA, with num_workers=0, for a set that takes
    at most a quarter of the GPU's free memory. Same batches either way (a run is bit-identical with it on or
    off); other sets' batches are copied to the GPU one ahead, on a stream of their own."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead (only with num_workers > 0)."""
    persistent_workers: bool = True
    """Keep workers alive between epochs (only with num_workers > 0)."""
    drop_last: bool = True
    """Drop each rank's last incomplete batch, so every optimizer step sees a full global batch."""
    dataset: Any = None
    """Your own data instead of the synthetic set: a Hydra node {_target_: pkg.make_data, ...} whose call returns
    (train_dataset, val_dataset) or {"train": ..., "val": ...}; val may be None. The fields above that describe
    the synthetic set are then ignored."""

    def __post_init__(self) -> None:
        self._one_of("name", ("synthetic",))
        check_target(self, "dataset")
        self._bounded("prefetch_factor", 1, INT32_MAX, 2, why="2**31-1")
        self._bounded("num_samples", 2, INT64_MAX, 32768, why="2**63-1")
        self._require(
            len(self.input_shape) >= 1 and all(1 <= int(d) <= INT64_MAX for d in self.input_shape),
            "input_shape",
            "must be a non-empty list of positive sizes (at most 2**63-1)",
            "e.g. data.input_shape=[784] or data.input_shape=[3,32,32]",
        )
        self._bounded("num_classes", 2, INT64_MAX, 10, why="2**63-1")
        self._bounded("seed", -INT64_MAX - 1, INT64_MAX, 0, why="int64: torch seeds a generator with it")
        self._require(0 <= self.val_fraction < 1, "val_fraction", "must be in [0, 1)", "e.g. data.val_fraction=0.1")
        self._bounded("class_separation", 0.0, FLOAT32_MAX, 3, above=True, why=F32)
        self._bounded("num_workers", 0, INT32_MAX, 0, why="2**31-1")
        self._require(
            not (self.on_device and self.num_workers),
            "on_device",
            f"reads the set where it is kept, without DataLoader workers, but data.num_workers={self.num_workers}",
            "set data.num_workers=0, or data.on_device=false to load through workers",
        )

    @property
    def num_val(self) -> int:
        return int(self.num_samples * self.val_fraction)

    @property
    def num_train(self) -> int:
        return self.num_samples - self.num_val


@dataclass
class ScheduleConfig(Checked):
    """Learning-rate schedule over optimizer steps: linear warmup, then constant, cosine or step decay."""

    _group: ClassVar[str] = "trainer.schedule"

    name: str = "constant"
    """constant | cosine (to min_lr_ratio x LR at the last step) | step (x gamma every step_every steps)."""
    warmup_steps: int = 0
    """Steps of linear warmup from 0 to the (scaled) LR."""
    min_lr_ratio: float = 0.0
    """cosine: the LR at the last step, as a fraction of the peak."""
    step_every: int = 1000
    """step: decay every this many steps (after warmup)."""
    gamma: float = 0.1
    """step: the factor of each decay."""

    def __post_init__(self) -> None:
        self._one_of("name", SCHEDULES)
        self._bounded("warmup_steps", 0, INT64_MAX, 100, why="2**63-1")
        self._require(
            0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]", "e.g. trainer.schedule.min_lr_ratio=0.1"
        )
        self._bounded("step_every", 1, INT64_MAX, 1000, why="2**63-1")
        self._require(0 < self.gamma <= 1, "gamma", "must be in (0, 1]", "e.g. trainer.schedule.gamma=0.1")


@dataclass
class EarlyStoppingConfig(Checked):
    """Stop when the monitored validation metric has not improved for ``patience`` validations."""

    _group: ClassVar[str] = "trainer.early_stopping"

    patience: int = 0
    """Validations without improvement before stopping (0: never stop early)."""
    monitor: str = "val_loss"
    """The validation metric to watch: val_loss, val_acc or val_metric (your trainer.metric)."""
    mode: str = "auto"
    """min or max; auto: min for val_loss, max for val_acc and val_metric (set min for an error-like metric)."""
    min_delta: float = 0.0
    """An improvement smaller than this does not count."""

    def __post_init__(self) -> None:
        self._bounded("patience", 0, INT64_MAX, 3, why="2**63-1; 0 is off")
        self._one_of("monitor", ("val_loss", "val_acc", "val_metric"))
        self._one_of("mode", ("auto", "min", "max"))
        self._bounded("min_delta", 0.0, FLOAT32_MAX, "1e-3", why=F32)

    @property
    def direction(self) -> str:
        """min or max. ``auto`` is resolved here, when it is read, never in ``__post_init__``: the schema's
        default node is built before the command line's ``monitor`` is merged, so resolving it there would
        freeze the default monitor's direction (val_loss: min) for a val_acc that should rise."""
        if self.mode != "auto":
            return self.mode
        return "min" if self.monitor == "val_loss" else "max"


@dataclass
class DDPConfig(Checked):
    """Options of torch's DistributedDataParallel (strategy=ddp)."""

    _group: ClassVar[str] = "trainer.ddp"

    find_unused_parameters: bool = False
    """Needed when some parameters get no gradient in a step (branches, frozen heads); costs a graph walk."""
    static_graph: bool = False
    """Promise the graph is the same every step: lets DDP skip work (and makes unused parameters fine)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the all-reduce buckets: no copy into and out of the buckets each step, and one
    gradient-sized buffer less. On, unlike torch's default (docs/performance.md has the figures). Set false if
    your code calls ``.detach_()`` on a gradient, which a view does not allow."""
    bucket_cap_mb: float = 25.0
    """Size of the gradient buckets all-reduced together."""

    def __post_init__(self) -> None:
        # DDP turns it into a whole number of bytes (a C++ size): a bucket beyond 1 TiB is one bucket anyway.
        self._bounded("bucket_cap_mb", 0.0, 1024.0 * 1024, 25, above=True, why="1 TiB")


@dataclass
class TrainerConfig(Checked):
    """The training loop. Step counts are optimizer steps."""

    _group: ClassVar[str] = "trainer"

    max_epochs: int | None = None
    """Stop after this many epochs (0: no epoch limit). Unset: 3 epochs, or no epoch limit when max_steps is set
    (Lightning's convention), so trainer.max_steps=1500 runs 1500 steps."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: no step limit). With both set, whichever comes first ends
    training; the start-up line says which one binds."""
    batch_size: int = 64
    """Samples per process per step; the global batch is batch_size x world size."""
    lr: float = 1e-4
    """Base learning rate, meant for a global batch of ``lr_reference_batch_size``. The default suits AdamW on the
    default job (docs/configuration.md says why not 1e-3); optim=sgd brings its own (0.05)."""
    lr_scaling: str = "none"
    """How the base LR follows the global batch: linear (SGD-like), sqrt (Adam-like) or none."""
    lr_reference_batch_size: int = 128
    """The global batch size the base LR was tuned for (128: the default job's 64 per rank x 2 ranks)."""
    seed: int = 0
    """Seed of model initialisation and data order; the same seed and world size give the same result."""
    device: str = "auto"
    """auto: CUDA when a GPU is visible, else CPU."""
    log_every_n_steps: int = 20
    """Write a metrics.jsonl row (and reduce the loss across ranks) every N steps."""
    val_every_n_steps: int = 0
    """Validate every N steps (0: off)."""
    val_every_n_epochs: int = 1
    """Validate at the end of every N epochs (0: off). A final validation always runs."""
    checkpoint_every_n_steps: int = 0
    """Save a checkpoint every N steps (0: off)."""
    checkpoint_every_min: float = 10.0
    """Save a checkpoint once this many minutes have passed since the last one (0: off), so that a crash, a lost
    node or a hang costs at most this much training. When a save takes more than 1% of the interval, the
    interval grows to 100 saves' time, and rank 0's log says so."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep (the newest verified one is never deleted)."""
    checkpoint_async: bool = False
    """Write checkpoints in the background: training is blocked only while rank 0 copies the state to CPU
    memory, and a thread writes the copy (atomically, verified, as a synchronous save). At most one write is in
    flight; a stop, the end of training and a requeue wait until it is durable (``hpc_train.train.writer``)."""
    divergence_steps: int = 1
    """Training has diverged after this many optimizer steps in a row with a non-finite loss or gradient norm on
    any rank: the run ends as ``diverged`` (fatal: no retry, no requeue) and keeps its last finite checkpoint
    (0: never stop for it). Steps that fp16's grad scaler skips do not count."""
    dist_timeout_s: float = 300.0
    """Timeout of the rendezvous and of every collective: a lost rank fails the job after this."""
    preflight_timeout_s: float = 120.0
    """How long ranks wait for each other at start-up (and for a first tiny all-reduce) before failing with the
    list of ranks that arrived."""
    watchdog_s: float = 900.0
    """No step for this long: every rank dumps its thread stacks into its log and exits non-zero (0: off)."""
    progress_bar: bool = True
    """Show a progress bar on rank 0 where a terminal shows it; never in piped output or a batch job's log,
    where its carriage-return redraws would pile up."""
    precision: str = "fp32"
    """fp32, or autocast to bf16 / fp16 (fp16 adds a GradScaler)."""
    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this (0: off)."""
    accumulate_grad_batches: int = 1
    """Micro-batches per optimizer step; gradients are synchronised on the last one only."""
    strategy: str = "ddp"
    """ddp: one process per rank; dp: one process, torch.nn.DataParallel over its GPUs; single: one process, one device."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    loss: Any = None
    """Your loss instead of cross entropy: {_target_: ...} whose call returns loss(outputs, targets) -> scalar."""
    metric: Any = None
    """Your validation metric instead of accuracy: {_target_: ...} whose call returns fn(outputs, targets) -> one
    value per sample; reported as val_metric, the mean over exactly the validation set."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <run dir>/tensorboard (rank 0)."""
    plots: bool = True
    """Write PNG curves of metrics.jsonl to <run dir>/plots at the end (rank 0)."""
    profile_steps: int = 0
    """Record a torch.profiler trace of this many steps on rank 0 into <run dir>/profile (0: off)."""
    init_from: str = ""
    """Start a new run from the weights of an earlier one: a run dir (its model_final.pt, else its newest
    checkpoint), a model_*.pt state dict or a checkpoints/step_*.pt file. Weights only: the optimizer, the step
    and the data order start afresh. Ignored when this run dir has a checkpoint of its own to resume from."""
    mirror: str = ""
    """A second store for the run's results ('' off): an absolute path (project space) or an fsspec URL
    (``s3://bucket/prefix``, with s3fs; credentials and endpoint from the environment or ``~/.aws``, never from
    here). Rank 0 copies each verified checkpoint, the final weights, config.yaml, overrides.json, metrics.jsonl
    and the status ledgers there in the background, checks each copy by reading it back, and keeps as many
    checkpoints as ``keep_checkpoints``. A run dir whose checkpoints are gone resumes from it
    (``hpc_train.mirror``)."""
    mirror_hook: str = ""
    """Your own copy function, ``module.function``, for a store fsspec does not know (as DeepLIIF's
    ``--remote-transfer-cmd``): rank 0 calls it in the background with the path of each file in the run dir once
    it is verified (each checkpoint, the final weights, config.yaml, metrics.jsonl, ...: what ``mirror`` copies,
    and after the copy when ``mirror`` is set too), again only once the file changed. A failure is a warning and
    the file is offered again at the next checkpoint."""
    mirror_wait_s: float = 60.0
    """How long a stop (preemption, time limit, end of training) waits for the copy in flight to land."""
    compile: bool = False
    """torch.compile the model (after the DDP wrap, so DDP's optimizer splits the graph at bucket boundaries).
    The first steps take longer (compilation); later ones launch fewer, fused kernels."""

    DEFAULT_EPOCHS: ClassVar[int] = 3

    @property
    def epoch_limit(self) -> int:
        """The epoch limit in force (0: none): max_epochs when set, else 3 unless max_steps is set."""
        if self.max_epochs is not None:
            return self.max_epochs
        return 0 if self.max_steps else self.DEFAULT_EPOCHS

    def __post_init__(self) -> None:
        if self.max_epochs is not None:
            self._bounded("max_epochs", 0, INT64_MAX, 3, why="2**63-1; 0 is no limit")
        self._bounded("max_steps", 0, INT64_MAX, 1000, why="2**63-1; 0 is no limit")
        self._require(
            self.epoch_limit > 0 or self.max_steps > 0,
            "max_steps",
            "max_steps and max_epochs are both 0, so training would never end",
            "set trainer.max_epochs=3 or trainer.max_steps=1000",
        )
        self._bounded("batch_size", 1, INT64_MAX, 64, why="2**63-1")
        self._bounded("lr", 0.0, FLOAT32_MAX, "1e-4", above=True, why=F32)
        self._one_of("lr_scaling", LR_SCALING)
        self._bounded("lr_reference_batch_size", 1, INT64_MAX, "128 (the global batch the base LR was tuned for)")
        # torch.manual_seed takes up to 2**64-1 and gets seed + rank; nothing seeds numpy or random with it.
        self._bounded("seed", -INT64_MAX - 1, INT64_MAX, 0, why="int64: torch seeds its generators with seed + rank")
        self._one_of("device", DEVICES)
        self._bounded("log_every_n_steps", 1, INT64_MAX, 20, why="2**63-1")
        for key in ("val_every_n_steps", "val_every_n_epochs", "checkpoint_every_n_steps"):
            self._bounded(key, 0, INT64_MAX, 0, why="2**63-1; 0 is off")
        self._bounded("divergence_steps", 0, INT64_MAX, 1, why="2**63-1; 0 is off")
        self._bounded("keep_checkpoints", 1, INT64_MAX, 2, why="2**63-1")
        self._bounded("checkpoint_every_min", 0.0, YEAR_MIN, 10, why="365 days; 0 is off")
        # Seconds go into timedelta, threading and faulthandler, which refuse inf and overflow far beyond a year.
        self._bounded("dist_timeout_s", 0.0, YEAR_S, 300, above=True, why="365 days")
        self._bounded("preflight_timeout_s", 0.0, YEAR_S, 120, above=True, why="365 days")
        self._bounded("watchdog_s", 0.0, YEAR_S, 900, why="365 days; 0 is off")
        self._one_of("precision", PRECISIONS)
        self._bounded("grad_clip_norm", 0.0, FLOAT32_MAX, "1.0 (0 is off)", why=F32)
        self._bounded("accumulate_grad_batches", 1, INT64_MAX, 4, why="2**63-1")
        self._one_of("strategy", STRATEGIES)
        check_target(self, "loss")
        check_target(self, "metric")
        self._bounded("profile_steps", 0, INT64_MAX, 5, why="2**63-1; 0 is off")
        self._bounded("mirror_wait_s", 0.0, YEAR_S, 60, why="365 days")
        self._check_mirror()
        self._require(
            isinstance(self.mirror_hook, str) and (not self.mirror_hook or bool(HOOK.match(self.mirror_hook))),
            "mirror_hook",
            "must name a function as module.function (dots, letters, digits and underscores only)",
            "e.g. trainer.mirror_hook=mylab.storage.copy_out",
        )
        if self.early_stopping.monitor == "val_metric":
            self._require(
                self.metric is not None,
                "early_stopping",
                "monitor=val_metric needs trainer.metric",
                "set trainer.metric={_target_: ...} or monitor val_loss / val_acc",
            )

    def _check_mirror(self) -> None:
        """A store hpc_train can name on every node: an absolute path or a URL, on one line (it goes into the job
        script's environment). Whether its package is installed is checked at submission (``launch.preflight``)."""
        value = self.mirror
        self._require(
            isinstance(value, str), "mirror", "must be a path or a URL", "e.g. trainer.mirror=s3://bucket/runs"
        )
        if not value:
            return
        hit = control_character(value)
        self._require(
            hit is None,
            "mirror",
            f"holds the control character {hit[1] if hit else ''}",
            "remove it from the value (look in the profile or experiment file that sets it)",
        )
        self._require(
            value.startswith("/") or bool(MIRROR_URL.match(value)),
            "mirror",
            "must be an absolute path (every node resolves a relative one elsewhere) or a URL with a bucket or host",
            "e.g. trainer.mirror=/project/me/runs/exp1 or trainer.mirror=s3://bucket/runs/exp1",
        )
