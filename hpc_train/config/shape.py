"""The shape of a run (nodes x tasks per node, and how each step's global batch is made up), which a run dir
may change on resume as long as the global batch stays the same (``hpc_train.launch.reshape``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_train.config.schema import Config

__all__ = ["SHAPE_KEYS", "Shape", "same_global_batch", "split_global_batch"]

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

    @classmethod
    def of(cls, cfg: Config) -> Shape:
        tc = cfg.trainer
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
        return (
            f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.tasks_per_node} task"
            f"{'s' if self.tasks_per_node != 1 else ''} (global batch {self.global_batch} = {self.batch_size} a rank "
            f"x {self.world_size} rank{'s' if self.world_size != 1 else ''} x {self.accumulate} accumulated)"
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


def split_global_batch(global_batch: int, world_size: int, batch_size: int, accumulate: int) -> tuple[int, int] | None:
    """(per-rank batch, accumulation) that make ``global_batch`` on ``world_size`` ranks, or None when no whole
    numbers do. The per-rank batch is kept where it can be (memory per rank stays as it was), then the
    accumulation; otherwise the largest per-rank batch below the old one that divides the rank's share."""
    if global_batch % world_size:
        return None
    share = global_batch // world_size  # samples a rank takes per optimizer step
    if share % batch_size == 0:
        return batch_size, share // batch_size
    if share % accumulate == 0 and share // accumulate <= batch_size:
        return share // accumulate, accumulate
    smaller = next(b for b in range(min(batch_size, share), 0, -1) if share % b == 0)
    return smaller, share // smaller


def same_global_batch(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Two flat configs (``{"trainer.batch_size": 32, ...}``, resolved) make the same global batch."""

    def product(flat: Mapping[str, Any]) -> int | None:
        total = 1
        for key in ("trainer.batch_size", "cluster.nodes", "cluster.tasks_per_node", "trainer.accumulate_grad_batches"):
            value = flat.get(key)
            if not isinstance(value, int):
                return None
            total *= value
        return total

    return product(old) is not None and product(old) == product(new)
