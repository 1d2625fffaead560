"""Built-in models, built from their config and the data's shape."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpc_train.config import CNNConfig, MLPConfig, TransformerConfig
from hpc_train.core.errors import ConfigError

__all__ = ["build_model"]


def _mlp(cfg: MLPConfig, input_shape: list[int], num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in cfg.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if cfg.dropout:
            layers.append(nn.Dropout(cfg.dropout))
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _cnn(cfg: CNNConfig, input_shape: list[int], num_classes: int) -> nn.Module:
    channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out in cfg.channels:
        layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
        channels, height, width = out, math.ceil(height / 2), math.ceil(width / 2)
    layers += [nn.Flatten(), nn.Linear(channels * height * width, cfg.hidden_size), nn.ReLU()]
    if cfg.dropout:
        layers.append(nn.Dropout(cfg.dropout))
    layers.append(nn.Linear(cfg.hidden_size, num_classes))
    return nn.Sequential(*layers)


class TransformerClassifier(nn.Module):
    """Linear token embedding + learned positions, a transformer encoder, mean pooling, a linear head."""

    def __init__(self, cfg: TransformerConfig, tokens: int, features: int, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, cfg.d_model)
        self.position = nn.Parameter(torch.zeros(1, tokens, cfg.d_model))
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.nhead, cfg.dim_feedforward, cfg.dropout, batch_first=True, norm_first=True
        )
        # The nested-tensor fast path only applies in eval with padding masks; off keeps train/eval identical.
        self.encoder = nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(cfg.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.position)
        return self.head(h.mean(dim=1))  # type: ignore[no-any-return]


def build_model(
    cfg: MLPConfig | CNNConfig | TransformerConfig | Mapping[str, Any], input_shape: list[int], num_classes: int
) -> nn.Module:
    """The model ``cfg`` describes, for inputs of ``input_shape`` and ``num_classes`` outputs; a ``_target_``
    mapping is called as the user wrote it and must return an nn.Module."""
    shape = [int(d) for d in input_shape]
    if isinstance(cfg, Mapping):
        # Hydra's instantiate only for a user's own model
        from hpc_train.train.usercode import call_target

        model = call_target(cfg, "model")
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"model._target_={cfg['_target_']!r} returned {type(model).__name__}, not a torch.nn.Module"
            )
        return model
    if isinstance(cfg, CNNConfig):
        return _cnn(cfg, shape, num_classes)
    if isinstance(cfg, TransformerConfig):
        tokens, features = shape
        return TransformerClassifier(cfg, tokens, features, num_classes)
    return _mlp(cfg, shape, num_classes)
