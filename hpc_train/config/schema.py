"""The whole job: ``Config`` holds one schema per group and checks the rules that span groups; ``resolve`` fills
in the values derived from others; ``RESUME_SAFE_KEYS`` are the keys a resumed run may change.

Nothing here mutates what it was given or looks at the filesystem: a saved config.yaml validates the same
on every rank, in the supervisor and in ``jobs status``. Checks against this machine's files run at submission
(``hpc_train.launch.preflight``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from omegaconf import MISSING

from hpc_train.config.checks import Checked, shell_words
from hpc_train.config.cluster import ClusterConfig
from hpc_train.config.options import CNNConfig, TransformerConfig
from hpc_train.config.shape import Shape, split_global_batch
from hpc_train.config.tracking import TrackingConfig
from hpc_train.config.training import DataConfig, TrainerConfig
from hpc_train.core.errors import ConfigError

__all__ = ["RESUME_SAFE_KEYS", "Config", "ScriptConfig", "resolve"]


@dataclass
class ScriptConfig(Checked):
    """Run your own torchrun-style script on every rank instead of the built-in trainer."""

    _group: ClassVar[str] = "script"

    path: str = ""
    """A Python file to run on every rank (made absolute, links resolved, when the run is submitted)."""
    module: str = ""
    """Or a module to run with python -m."""
    command: str = ""
    """Or an executable (a console entry point such as ``deepliif``, or a path), run as it is, like torchrun's
    --no-python; it must be found on PATH when the run is submitted."""
    args: Any = field(default_factory=list)
    """Its command-line arguments: a list (script.args=[--epochs,3]), or one string split like a shell would
    (script.args="--out x --lr=1e-3": on the command line the value is taken as written, = and commas
    included), or everything after a lone -- on the command line
    (hpc-train script.path=train.py -- --tag "a,b" --lr=1e-3)."""
    torchrun_env: bool = True
    """Give the script the variables torchrun would (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...). false runs a
    one-rank script as a plain single process, without them: for scripts that take their DDP path whenever
    LOCAL_RANK is set (DeepLIIF). Refused for more than one rank."""
    global_batch: int | None = None
    """The samples of one optimizer step, over all ranks, that your script keeps on any node count: it takes its
    per-rank batch and accumulation from ``hpc_train.global_batch.GlobalBatch`` (and its data order from that
    batch's sampler). With it the script may run on a node range (``cluster.min_nodes``), grow, go on without a
    lost node, and resume on another shape; without it those are refused. It must split over the ranks of every
    node count the run may train on."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        given = [key for key in ("path", "module", "command") if getattr(self, key)]
        self._require(
            len(given) <= 1,
            given[-1] if given else "path",
            f"give one of script.path, script.module and script.command, not {' and '.join(given)}",
            "drop all but one",
        )
        self._require(
            (isinstance(self.args, Sequence) and not isinstance(self.args, str))
            or (isinstance(self.args, str) and (not self.args.strip() or bool(shell_words(self.args)))),
            "args",
            "must be a list of words, or one string that splits like a shell command line (balanced quotes)",
            "script.args='--tag \"a,b\" --lr=1e-3', or put the arguments after -- at the end of the command line",
        )
        if self.global_batch is not None:
            self._bounded("global_batch", 1, 2**31 - 1, 256, why="samples per optimizer step, over all ranks")
        # Whether script.path is a file and script.command is on PATH is checked at submission, against the
        # files there (hpc_train.launch.preflight.check_paths): not here, where a saved config is read again.

    @property
    def enabled(self) -> bool:
        return bool(self.path or self.module or self.command)

    @property
    def argv(self) -> list[str]:
        """The script's arguments as words: a string is split like a shell would ([] if it cannot be)."""
        if isinstance(self.args, str):
            return shell_words(self.args)
        return [str(a) for a in self.args]


RESUME_SAFE_KEYS = (
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.log_every_n_steps",
    "trainer.val_every_n_steps",
    "trainer.val_every_n_epochs",
    "trainer.checkpoint_every_n_steps",
    "trainer.checkpoint_every_min",
    "trainer.keep_checkpoints",
    "trainer.checkpoint_async",
    "trainer.divergence_steps",
    "trainer.dist_timeout_s",
    "trainer.preflight_timeout_s",
    "trainer.watchdog_s",
    "trainer.progress_bar",
    "trainer.tensorboard",
    "trainer.plots",
    "trainer.profile_steps",
    "trainer.early_stopping.patience",
    "trainer.init_from",  # read only when the run dir has no checkpoint of its own
    "trainer.mirror",  # a mirror added later gets the run from its next checkpoint on
    "trainer.mirror_wait_s",
    "trainer.mirror_hook",
    # A tracker added or changed later gets the run from then on (the run dir keeps one run per tracker store).
    "tracking.mlflow.uri",
    "tracking.mlflow.experiment",
    "tracking.wandb.project",
    "tracking.wandb.mode",
    "tracking.wandb.entity",
    "data.on_device",  # where the batches are gathered, not which: the same batches either way
    "cluster.timeout_min",
    "cluster.failure_grace_s",
    "cluster.status_every_s",
    "cluster.stragglers.enabled",
    "cluster.stragglers.window_s",
    "cluster.stragglers.margin",
    "cluster.stragglers.windows",
    "cluster.stragglers.replace_after_s",
    "cluster.slurm.submit",
    "cluster.slurm.dry_run",
    "cluster.slurm.wait",
    "cluster.slurm.partition",
    "cluster.slurm.account",
    "cluster.slurm.qos",
    "cluster.slurm.constraint",
    "cluster.slurm.exclude",
    "cluster.slurm.mem",
    "cluster.slurm.job_name",
    "cluster.slurm.sbatch_args",
    "cluster.slurm.setup",
    "cluster.slurm.python",
    "cluster.slurm.container",
    "cluster.slurm.srun_args",
    "cluster.slurm.srun_wait_s",
    "cluster.signal",
    "cluster.slurm.signal_lead_s",
    "cluster.slurm.array_parallelism",
    "cluster.facts",
    "cluster.slurm.max_restarts",
    "cluster.slurm.max_stalled_restarts",
    "cluster.slurm.spare_nodes",
    "cluster.min_nodes",
    "cluster.slurm.max_failures",
    "cluster.slurm.max_stalled_failures",
    "cluster.slurm.shape",
    "cluster.slurm.scaling",
    "cluster.slurm.grow_every_min",
)
"""Keys a resubmission of a run dir may change: they do not change what has been trained so far (how long to
go on, how often to log and save, where and how the job is queued). Every other key is fixed by the run's
first config.yaml: the model, data, optimizer, seed, batch and the shape of the job."""


@dataclass
class Config:
    """The whole job. ``model`` and ``optim`` hold one of the schemas in MODEL_SCHEMAS / OPTIM_SCHEMAS."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: Any = MISSING
    """One of MODEL_SCHEMAS, or your own model as {_target_: pkg.Net, ...} (a dict)."""
    optim: Any = MISSING
    script: ScriptConfig = field(default_factory=ScriptConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        shape = list(self.data.input_shape)
        if isinstance(self.model, CNNConfig) and len(shape) != 3:
            raise ConfigError(
                f"data.input_shape={shape} does not suit model=cnn, which needs [channels, height, width]. "
                "HINT: set data.input_shape=[3,32,32], or use model=mlp."
            )
        if isinstance(self.model, TransformerConfig) and len(shape) != 2:
            raise ConfigError(
                f"data.input_shape={shape} does not suit model=transformer, which needs [tokens, features]. "
                "HINT: set data.input_shape=[16,49] (784 values as 16 tokens), or use model=mlp."
            )
        if (
            self.trainer.device == "cuda"
            and self.cluster.gpus_per_node == 0
            and self.cluster.launcher != "debug"  # debug runs in this process and sees what this process sees
            and not self.script.enabled
        ):
            raise ConfigError(
                "trainer.device=cuda, but cluster.gpus_per_node=0 gives the ranks no GPU: the local launcher and "
                "Slurm hide every GPU a job did not ask for. HINT: set cluster.gpus_per_node=1 (a GPU per rank: "
                "the number of ranks on a node), or trainer.device=auto to train on the CPU."
            )
        world = self.cluster.world_size
        no_gpu = self.trainer.device == "cpu" or not self.cluster.gpus_per_node
        # (not on debug: it runs in this process, which may see this machine's GPUs)
        if self.trainer.strategy == "dp" and no_gpu and self.cluster.launcher != "debug":
            raise ConfigError(
                "trainer.strategy=dp splits each batch over the GPUs of one process, but this run has no GPU "
                f"(cluster.gpus_per_node={self.cluster.gpus_per_node}, trainer.device={self.trainer.device}): it "
                "would train in one process, silently. HINT: for CPU parallelism use trainer.strategy=ddp with "
                "cluster.tasks_per_node=N; or trainer.strategy=single for one process."
            )
        if self.trainer.strategy in ("dp", "single") and world != 1:
            raise ConfigError(
                f"trainer.strategy={self.trainer.strategy} runs one process, but the cluster asks for {world} ranks. "
                "HINT: set cluster.tasks_per_node=1 (and cluster.nodes=1), or trainer.strategy=ddp."
            )
        if self.data.dataset is None:
            self._check_synthetic_sizes(world)
        self._check_script_batch(world)  # first: the range's check reads the script's shape from it
        if self.cluster.fewest_nodes < self.cluster.nodes:
            self._check_shrink()
        self._check_torchrun_env(world)

    def _check_script_batch(self, world: int) -> None:
        """script.global_batch: a script of the user's, and a global batch its ranks can share."""
        batch = self.script.global_batch
        if batch is None:
            return
        if not self.script.enabled:
            raise ConfigError(
                f"script.global_batch={batch} is the global batch of a script of your own, but none is given (the "
                "built-in trainer's is trainer.batch_size x ranks x trainer.accumulate_grad_batches). HINT: add "
                "script.path=..., script.module=... or script.command=..., or drop script.global_batch"
            )
        if batch % world:
            raise ConfigError(
                f"script.global_batch={batch} does not split over the {world} ranks of cluster.nodes="
                f"{self.cluster.nodes} x {self.cluster.ranks_per_node} per node: every rank takes the same number "
                f"of samples a step. HINT: set script.global_batch to your script's per-rank batch x {world} ranks x "
                "its accumulation"
            )

    def _check_torchrun_env(self, world: int) -> None:
        """script.torchrun_env=false: a single process, so one rank of a script."""
        if self.script.torchrun_env:
            return
        if not self.script.enabled:
            raise ConfigError(
                "script.torchrun_env=false applies to a script of your own, but none is given. HINT: add "
                "script.path=..., script.module=... or script.command=..., or drop script.torchrun_env"
            )
        if world != 1:
            raise ConfigError(
                f"script.torchrun_env=false runs the script as one plain process, without RANK, WORLD_SIZE and "
                f"MASTER_ADDR, but the cluster asks for {world} ranks (cluster.nodes={self.cluster.nodes} x "
                f"{self.cluster.ranks_per_node} per node): the copies could not find each other and would each "
                "train alone. HINT: set cluster.nodes=1 cluster.tasks_per_node=1, or drop script.torchrun_env to "
                "give every rank the torchrun variables"
            )

    def _check_shrink(self) -> None:
        """cluster.min_nodes below cluster.nodes: the built-in trainer can keep its global batch on that many."""
        cluster = self.cluster
        if self.script.enabled and self.script.global_batch is None:
            raise ConfigError(
                f"cluster.min_nodes={cluster.min_nodes} lets a job go on with fewer nodes than "
                f"cluster.nodes={cluster.nodes}, but a script's batch size and data order are its own: it would go "
                f"on with another global batch, silently. HINT: take the per-rank batch and the data order from "
                f"hpc_train.global_batch.GlobalBatch in your script and set script.global_batch to its global batch "
                f"(per-rank batch x {cluster.nodes * cluster.ranks_per_node} ranks x accumulation); or remove "
                f"cluster.min_nodes (cluster.slurm.spare_nodes=1 replaces a lost node instead)"
            )
        shape = Shape.of(self)
        ranks = cluster.fewest_nodes * cluster.ranks_per_node
        if split_global_batch(shape.global_batch, ranks, shape.batch_size, shape.accumulate) is None:
            fits = [
                n
                for n in range(cluster.fewest_nodes, cluster.nodes)
                if shape.global_batch % (n * cluster.ranks_per_node) == 0
            ]
            hint = f"set cluster.min_nodes={fits[0]}" if fits else "remove cluster.min_nodes"
            raise ConfigError(
                f"cluster.min_nodes={cluster.min_nodes}: the global batch of {shape.describe()} does not split over "
                f"{ranks} ranks ({cluster.fewest_nodes} x {cluster.ranks_per_node}), so training could not go on "
                f"with the same global batch on {cluster.fewest_nodes} nodes. HINT: {hint}, or make the global "
                f"batch a multiple of {ranks}"
            )

    def _check_synthetic_sizes(self, world: int) -> None:
        per_rank = self.data.num_train // world
        micro = self.trainer.batch_size * self.trainer.accumulate_grad_batches
        if per_rank < micro and self.data.drop_last:
            raise ConfigError(
                f"trainer.batch_size={self.trainer.batch_size} x trainer.accumulate_grad_batches="
                f"{self.trainer.accumulate_grad_batches} is more than the {per_rank} training samples each of "
                f"{world} ranks gets (data.num_samples={self.data.num_samples}, data.val_fraction="
                f"{self.data.val_fraction}), so with data.drop_last=true no step would run. HINT: lower "
                "trainer.batch_size or raise data.num_samples."
            )
        if self.data.num_val and self.data.num_val < world:
            raise ConfigError(
                f"data.val_fraction={self.data.val_fraction} leaves {self.data.num_val} validation samples for "
                f"{world} ranks; every rank needs at least one. HINT: raise data.val_fraction or data.num_samples, "
                "or set data.val_fraction=0 to skip validation."
            )

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: per process x world size x accumulation."""
        return self.trainer.batch_size * self.cluster.world_size * self.trainer.accumulate_grad_batches


def resolve(cfg: Config) -> Config:
    """``cfg`` with the values that follow from others filled in, as config.yaml saves them and the launchers and
    ranks read them: ``cluster.tasks_per_node=0`` becomes the number of ranks it means (one per GPU, one on a
    CPU job). A new Config; ``cfg`` is left as it was. (``trainer.early_stopping.mode=auto`` is kept as written:
    ``EarlyStoppingConfig.direction`` reads it against the final monitor.)"""
    cluster = cfg.cluster.resolved()
    return cfg if cluster is cfg.cluster else replace(cfg, cluster=cluster)
