"""Checkpoints: written atomically, pruned to the newest K, and resumed from the newest one that loads.

A checkpoint is one file per step (``RunDir.checkpoint(step)``), written by rank 0 after every rank
has sent it its random-number state, so a resumed run draws the same numbers on every rank as the
uninterrupted run would have. Writing goes through a temp file, fsync and rename: a crash during the write
leaves the previous checkpoint as the newest complete one. Loading uses ``weights_only=True`` (tensors,
numbers, strings, lists and dicts only), so a checkpoint cannot run code when it is read.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch

from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write

__all__ = [
    "REQUIRED_KEYS",
    "capture_rng",
    "find_resumable",
    "load_checkpoint",
    "load_init_weights",
    "prune_checkpoints",
    "restore_rng",
    "save_atomic",
]

log = logging.getLogger(__name__)

REQUIRED_KEYS = frozenset({"model", "optimizer", "scheduler", "scaler", "step", "epoch", "step_in_epoch", "rng"})


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` through ``atomic_write`` (temp file, fsync, rename)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def prune_checkpoints(files: list[Path], keep: int) -> None:
    """Delete all but the newest ``keep`` of ``files`` (``RunDir.checkpoint_files()``: oldest first)."""
    for old in files[:-keep]:
        old.unlink(missing_ok=True)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This rank's random-number state: torch (CPU and its GPU), Python's and numpy's global generators.

    numpy's state becomes plain lists and numbers so that a ``weights_only`` load accepts it.
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _plain(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np
    except ImportError:  # numpy is optional for torch
        return state
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint in ``path``; ValueError if it is damaged or incomplete."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read means the file is unusable
        raise ValueError(f"{path} cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None
    missing = REQUIRED_KEYS - set(state) if isinstance(state, dict) else REQUIRED_KEYS
    if missing:
        raise ValueError(f"{path} lacks {', '.join(sorted(missing))}")
    return dict(state)


def find_resumable(files: list[Path]) -> tuple[Path, dict[str, Any]] | None:
    """The newest of ``files`` (oldest first) that loads completely, with its content; damaged ones are
    skipped with a warning (and left in place for inspection). None when there is none."""
    for path in reversed(files):
        try:
            return path, load_checkpoint(path)
        except ValueError as exc:
            log.warning("skipping a damaged checkpoint: %s", exc)
    return None


def load_init_weights(source: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The model weights ``trainer.init_from`` names: a run dir's model_final.pt (else its newest complete
    checkpoint), a plain state dict, or a checkpoint's model. ConfigError when there are none."""
    from hpc_train.core.rundir import RunDir

    path = source
    if source.is_dir():
        run = RunDir(source)
        found = find_resumable(run.checkpoint_files())
        path = run.model_final if run.model_final.is_file() else (found[0] if found else run.model_final)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read means there is nothing to start from
        raise ConfigError(
            f"trainer.init_from={str(source)!r}: {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}). "
            "HINT: name a run dir with model_final.pt or a checkpoint, or a model_*.pt / step_*.pt file."
        ) from None
    weights = state["model"] if isinstance(state, dict) and "model" in state and "optimizer" in state else state
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ConfigError(f"trainer.init_from={str(source)!r}: {path} holds no model state dict")
    return path, weights
