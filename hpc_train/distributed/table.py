"""The rank table: one row per rank, gathered to rank 0 at start, so wrong ranks or masters show at once."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hpc_train.core.textutil import format_table
from hpc_train.distributed.env import DistEnv

__all__ = ["RankRow", "format_rank_table", "gather_rank_table"]


@dataclass(frozen=True)
class RankRow:
    """What one rank believes about itself."""

    host: str
    rank: int
    local_rank: int
    node: int
    device: str
    backend: str
    master: str
    source: str
    pid: int
    cuda_visible_devices: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _own_row(env: DistEnv, device: torch.device) -> RankRow:
    return RankRow(
        host=env.hostname,
        rank=env.rank,
        local_rank=env.local_rank,
        node=env.node_rank,
        device=str(device),
        backend=str(dist.get_backend()),
        master=f"{env.master_addr}:{env.master_port}",
        source=env.source,
        pid=os.getpid(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    )


def gather_rank_table(env: DistEnv, device: torch.device) -> list[RankRow]:
    """Every rank's row, ordered by rank (a collective: all ranks must call it)."""
    rows: list[RankRow | None] = [None] * env.world_size
    dist.all_gather_object(rows, _own_row(env, device))
    assert all(r is not None for r in rows), "all_gather_object left a hole"
    return sorted((r for r in rows if r is not None), key=lambda r: r.rank)


_COLUMNS = [
    ("host", "host"),
    ("rank", "rank"),
    ("local_rank", "local"),
    ("node", "node"),
    ("device", "device"),
    ("backend", "backend"),
    ("master", "MASTER_ADDR:PORT"),
    ("source", "source"),
]


def format_rank_table(rows: list[RankRow]) -> str:
    """A fixed-width text table of ``rows``."""
    return format_table([title for _, title in _COLUMNS], [[getattr(row, key) for key, _ in _COLUMNS] for row in rows])
