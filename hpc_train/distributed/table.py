"""The rank table: one row per rank, gathered to rank 0 at start, so wrong ranks or masters show at once."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hpc_train.core.hostlist import compress_hostlist
from hpc_train.core.records import RankTableEntry
from hpc_train.core.textutil import first_few, format_table, number_ranges, plural
from hpc_train.distributed.env import DistEnv

__all__ = ["FULL_TABLE_UP_TO", "RankRow", "format_rank_table", "gather_rank_table", "summarize_rank_table"]

FULL_TABLE_UP_TO = 8
"""A rank table up to this many ranks is printed whole; a larger one, a line per shape of node."""


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

    def entry(self, attempt: int, asked: str | None = None) -> RankTableEntry:
        """Its row of ``rank_table.json``, with the attempt that gathered it."""
        return RankTableEntry.from_json({**self.as_dict(), "attempt": attempt, **({"asked": asked} if asked else {})})


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
    """Every rank's row, ordered by rank, on rank 0 (a collective: all ranks must call it; the others get their
    own row only). A gather, not an all-gather: at 4,096 ranks each rank would otherwise receive 4,096 rows."""
    own = _own_row(env, device)
    rows: list[RankRow | None] | None = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(own, rows, dst=0)
    if rows is None:
        return [own]
    assert all(r is not None for r in rows), "gather_object left a hole"
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


def summarize_rank_table(rows: Sequence[RankRow], full_up_to: int = FULL_TABLE_UP_TO) -> str:
    """The rank table in a few lines at any scale: what all ranks share, then one line per kind of node (its
    hosts in hostlist form, ranks per node, the ranks and devices), then the ranks that differ from the rest
    (another master, backend or source: the first few, and a count). Up to ``full_up_to`` ranks: every row."""
    if len(rows) <= full_up_to:
        return format_rank_table(list(rows))
    shared = Counter((r.backend, r.master, r.source) for r in rows).most_common(1)[0][0]
    odd = [r for r in rows if (r.backend, r.master, r.source) != shared]
    by_host: dict[str, list[RankRow]] = {}
    for row in rows:
        by_host.setdefault(row.host, []).append(row)
    kinds: dict[tuple[int, str], list[str]] = {}
    for host, own in by_host.items():
        devices = number_ranges(_index(r.device) for r in own) if all(":" in r.device for r in own) else ""
        kind = own[0].device.split(":")[0] + (f":{devices}" if devices else "")
        kinds.setdefault((len(own), kind), []).append(host)
    lines = [
        f"{plural(len(rows), 'rank')} on {plural(len(by_host), 'node')}; backend {shared[0]}, "
        f"MASTER_ADDR:PORT {shared[1]}, from {shared[2]}"
    ]
    for (count, kind), hosts in sorted(kinds.items(), key=lambda k: -len(k[1])):
        ranks = [r.rank for host in hosts for r in by_host[host]]
        lines.append(
            f"  {compress_hostlist(hosts)}: {plural(len(hosts), 'node')} x {count} ranks ({kind}), "
            f"ranks {number_ranges(ranks)}"
        )
    if odd:
        described = [f"rank {r.rank} on {r.host}: {r.backend} {r.master} from {r.source}" for r in odd]
        lines.append(f"  differing from the rest: {first_few(described)}")
    lines.append("  (every rank's row: rank_table.json)")
    return "\n".join(lines)


def _index(device: str) -> int:
    number = device.rpartition(":")[2]
    return int(number) if number.isdigit() else 0
