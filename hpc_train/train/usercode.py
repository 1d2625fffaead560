"""Your own model, data, loss or metric, named by a Hydra ``_target_`` in the config."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hpc_train.core.errors import ConfigError

__all__ = ["build_loss", "build_metric", "call_target", "split_datasets"]

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def call_target(node: Mapping[str, Any], key: str) -> Any:
    """Call ``node['_target_']`` with the node's other entries as keyword arguments (hydra.utils.instantiate)."""
    # Hydra only for a user's own _target_
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(dict(node))
    except InstantiationException as exc:
        raise ConfigError(
            f"{key}._target_={node.get('_target_')!r} could not be called: {exc}. HINT: the module must be importable "
            "on every rank (run from its folder or put it on PYTHONPATH)."
        ) from exc


def build_loss(node: Mapping[str, Any] | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross entropy, or the user's loss(outputs, targets) -> mean loss of the batch."""
    if node is None:
        return nn.CrossEntropyLoss()
    loss = call_target(node, "trainer.loss")
    if not callable(loss):
        raise ConfigError(f"trainer.loss._target_={node['_target_']!r} returned {type(loss).__name__}, not a callable")
    return loss  # type: ignore[no-any-return]


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).to(torch.float64)


def build_metric(node: Mapping[str, Any] | None) -> tuple[str, Metric]:
    """(row key, fn(outputs, targets) -> one value per sample): accuracy, or the user's metric."""
    if node is None:
        return "val_acc", _accuracy
    metric = call_target(node, "trainer.metric")
    if not callable(metric):
        raise ConfigError(
            f"trainer.metric._target_={node['_target_']!r} returned {type(metric).__name__}, not a callable"
        )
    return "val_metric", metric


def split_datasets(result: Any, target: str) -> tuple[Dataset[Any], Dataset[Any] | None]:
    """Accept (train, val), {"train": ..., "val": ...} or a lone train set from a user's data function."""
    if isinstance(result, Mapping):
        return result["train"], result.get("val")
    if isinstance(result, tuple | list) and len(result) == 2:
        return result[0], result[1]
    if isinstance(result, Dataset):
        return result, None
    raise ConfigError(
        f"data.dataset._target_={target!r} returned {type(result).__name__}; expected (train, val), "
        '{"train": ..., "val": ...} or a Dataset.'
    )
