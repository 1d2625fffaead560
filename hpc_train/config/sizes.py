"""The memory-size grammar of ``cluster.slurm.mem``: the one parser both validation and the cluster checks read."""

from __future__ import annotations

import math
import re

__all__ = ["is_mem_size", "mem_mb"]


def mem_mb(value: str) -> int:
    """A ``cluster.slurm.mem`` size (``500M``, ``64G``, ``1T``, a plain number = MB) in MB; 0 asks for all of a node's.
    ValueError when it is not a size."""
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", value, flags=re.I)
    if match is None:
        raise ValueError(f"not a memory size: {value!r}")
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match[2].upper()]
    return math.ceil(int(match[1]) * scale)


def is_mem_size(value: str) -> bool:
    try:
        mem_mb(value)
    except ValueError:
        return False
    return True
