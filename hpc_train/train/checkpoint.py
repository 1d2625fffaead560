"""Atomic saving: a reader (or a resumed run) never sees half a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hpc_train.rundir import atomic_write

__all__ = ["prune_checkpoints", "save_atomic"]


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` through ``atomic_write`` (temp file, fsync, rename)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` ``step_*.pt`` files (names sort by step: zero-padded)."""
    for old in sorted(folder.glob("step_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
