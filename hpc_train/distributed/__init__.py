"""Rank resolution and process-group setup.

Public API::

    resolve_environment(environ=None) -> DistEnv   # torchrun > Slurm step > submitit local > single
    expand_hostlist(expr) -> list[str]             # Slurm hostlist, as `scontrol show hostnames`
    select_device(env, use_cuda) -> torch.device
    auto_uses_cuda(env) -> bool                    # trainer.device=auto: a GPU for every local rank?
    distributed(env, device, timeout)              # context manager: init_distributed / teardown_distributed
    gather_rank_table(env, device), format_rank_table(rows)

Importing this package does not import torch; the torch-dependent names load on first use, so launchers and
dry-runs can resolve ranks without paying for ``import torch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_train.core.hostlist import expand_hostlist, parse_tasks_per_node
from hpc_train.core.lazy import lazy_attributes
from hpc_train.distributed.env import (
    PORT_BASE,
    PORT_SPAN,
    DistEnv,
    Source,
    derive_port,
    detect_source,
    resolve_environment,
)

if TYPE_CHECKING:
    from hpc_train.distributed.process_group import (
        auto_uses_cuda,
        distributed,
        init_distributed,
        select_device,
        teardown_distributed,
    )
    from hpc_train.distributed.table import RankRow, format_rank_table, gather_rank_table, summarize_rank_table

_LAZY = {
    "auto_uses_cuda": "process_group",
    "distributed": "process_group",
    "init_distributed": "process_group",
    "select_device": "process_group",
    "teardown_distributed": "process_group",
    "RankRow": "table",
    "format_rank_table": "table",
    "gather_rank_table": "table",
    "summarize_rank_table": "table",
}

__all__ = [
    "PORT_BASE",
    "PORT_SPAN",
    "DistEnv",
    "RankRow",
    "Source",
    "auto_uses_cuda",
    "derive_port",
    "detect_source",
    "distributed",
    "expand_hostlist",
    "format_rank_table",
    "gather_rank_table",
    "init_distributed",
    "parse_tasks_per_node",
    "resolve_environment",
    "select_device",
    "summarize_rank_table",
    "teardown_distributed",
]


__getattr__ = lazy_attributes(__name__, _LAZY)
