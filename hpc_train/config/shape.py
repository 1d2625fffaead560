"""The shape of a run (nodes x tasks per node, and how each step's global batch is made up), which a run dir
may change on resume as long as the global batch stays the same (``hpc_train.launch.reshape``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hpc_train.core.batch import split_global_batch
from hpc_train.core.errors import ConfigError

if TYPE_CHECKING:  # for annotations only: schema imports this module (Config checks its own shape with it)
    from hpc_train.config.cluster import ClusterConfig
    from hpc_train.config.schema import Config

__all__ = [
    "ASKED_VARIABLE",
    "NODES_VARIABLE",
    "SHAPE_KEYS",
    "Shape",
    "fits_on",
    "on_nodes",
    "same_global_batch",
    "split_global_batch",
]

NODES_VARIABLE = "HPC_TRAIN_NODES"
"""Set by the Slurm supervisor on an attempt it runs on fewer nodes than ``cluster.nodes`` (after losing one,
down to ``cluster.min_nodes``): the ranks read the config ``on_nodes`` that many."""

ASKED_VARIABLE = "HPC_TRAIN_ASKED"
"""Set by the Slurm supervisor for a job that asked for a node range: 'asked for 2-8 nodes, got 4', which rank 0
puts in the rank table's heading."""

SHAPE_KEYS = ("cluster.nodes", "cluster.tasks_per_node", "trainer.batch_size", "trainer.accumulate_grad_batches")
"""Keys a resubmission may change together, as long as the global batch stays what the run was trained with."""


@dataclass(frozen=True, kw_only=True)
class Shape:
    """How a run is laid out: nodes x tasks per node, and how each step's global batch is made up."""

    nodes: int
    tasks_per_node: int
    batch_size: int
    """Per rank and micro-batch."""
    accumulate: int
    script: bool = False
    """A user's script's shape (``script.global_batch``): ``batch_size`` is a rank's share of a step, which the
    script splits into micro-batches itself."""

    @classmethod
    def of(cls, cfg: Config) -> Shape:
        """The built-in trainer's shape; a script's with ``script.global_batch``: its share a rank, unaccumulated
        (the script splits it into micro-batches itself, through ``hpc_train.global_batch``)."""
        tc, world = cfg.trainer, cfg.cluster.nodes * cfg.cluster.ranks_per_node
        if cfg.script.enabled and cfg.script.global_batch is not None and cfg.script.global_batch % world == 0:
            share = cfg.script.global_batch // world
            return cls(
                nodes=cfg.cluster.nodes,
                tasks_per_node=cfg.cluster.ranks_per_node,
                batch_size=share,
                accumulate=1,
                script=True,
            )
        return cls(
            nodes=cfg.cluster.nodes,
            tasks_per_node=cfg.cluster.ranks_per_node,
            batch_size=tc.batch_size,
            accumulate=tc.accumulate_grad_batches,
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accumulate

    def describe(self) -> str:
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        split = (
            f"{self.batch_size} a rank a step x {ranks}, split by the script"
            if self.script
            else f"{self.batch_size} a rank x {ranks} x {self.accumulate} accumulated"
        )
        return (
            f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.tasks_per_node} task"
            f"{'s' if self.tasks_per_node != 1 else ''} (global batch {self.global_batch} = {split})"
        )

    def record(self) -> dict[str, int]:
        """What a checkpoint keeps of the shape that wrote it."""
        return {
            "nodes": self.nodes,
            "tasks_per_node": self.tasks_per_node,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "accumulate": self.accumulate,
            "global_batch": self.global_batch,
        }


def same_global_batch(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Two flat configs (``{"trainer.batch_size": 32, ...}``, resolved) make the same global batch: the built-in
    trainer's product, or a script's ``script.global_batch`` (a script without one has none to keep)."""
    script = old.get("script.global_batch"), new.get("script.global_batch")
    if any(old.get(f"script.{k}") or new.get(f"script.{k}") for k in ("path", "module", "command")):
        return isinstance(script[0], int) and script[0] == script[1]

    def product(flat: Mapping[str, Any]) -> int | None:
        total = 1
        for key in ("trainer.batch_size", "cluster.nodes", "cluster.tasks_per_node", "trainer.accumulate_grad_batches"):
            value = flat.get(key)
            if not isinstance(value, int):
                return None
            total *= value
        return total

    return product(old) is not None and product(old) == product(new)


def _split_on(cfg: Config, nodes: int) -> tuple[int, int] | None:
    shape = Shape.of(cfg)
    return split_global_batch(shape.global_batch, nodes * shape.tasks_per_node, shape.batch_size, shape.accumulate)


def fits_on(cfg: Config, nodes: int) -> bool:
    """The run's global batch splits over ``nodes`` nodes of its tasks per node."""
    return nodes == cfg.cluster.nodes or _split_on(cfg, nodes) is not None


def _attempt_cluster(cluster: ClusterConfig, nodes: int) -> ClusterConfig:
    """``cluster`` as one attempt on ``nodes`` of its range: a shape to train on, not a job to submit. On the
    range's fewest nodes it is no longer a range, so the keys only a range allows are set aside there (the shape
    table's pick, a straggler's replacement with no spare): the supervisor holds the submitted config and makes
    those decisions, and says a slow node stays when no node is left to leave it for."""
    fewest = min(nodes, cluster.fewest_nodes)
    if fewest < nodes:
        return replace(cluster, nodes=nodes, min_nodes=fewest)
    slurm = replace(cluster.slurm, shape="range")
    stragglers = cluster.stragglers
    if not cluster.slurm.spare_nodes:
        stragglers = replace(stragglers, replace_after_s=0.0)
    return replace(cluster, nodes=nodes, min_nodes=fewest, slurm=slurm, stragglers=stragglers)


def on_nodes(cfg: Config, nodes: int) -> Config:
    """``cfg`` trained on ``nodes`` nodes instead of ``cluster.nodes``, with the same global batch: the per-rank
    batch and accumulation that ``split_global_batch`` picks. ConfigError where it does not split (the check of
    cluster.min_nodes and the supervisor's choice of nodes keep that from happening)."""
    if nodes == cfg.cluster.nodes:
        return cfg
    split = _split_on(cfg, nodes)
    if split is None:
        raise ConfigError(
            f"{NODES_VARIABLE}={nodes}: the global batch of {Shape.of(cfg).describe()} does not split over {nodes} "
            f"nodes. HINT: set cluster.min_nodes to a node count that divides it"
        )
    cluster = _attempt_cluster(cfg.cluster, nodes)
    if cfg.script.enabled:  # script.global_batch stays; the script splits it over its ranks itself
        return replace(cfg, cluster=cluster)
    batch_size, accumulate = split
    trainer = replace(cfg.trainer, batch_size=batch_size, accumulate_grad_batches=accumulate)
    return replace(cfg, cluster=cluster, trainer=trainer)
