"""Built-in models, built from their config and the data's shape."""

from __future__ import annotations

import math

from torch import nn

from hpc_train.config import CNNConfig, MLPConfig

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


def build_model(cfg: MLPConfig | CNNConfig, input_shape: list[int], num_classes: int) -> nn.Module:
    """The model ``cfg`` describes, for inputs of ``input_shape`` and ``num_classes`` outputs."""
    shape = [int(d) for d in input_shape]
    if isinstance(cfg, CNNConfig):
        return _cnn(cfg, shape, num_classes)
    return _mlp(cfg, shape, num_classes)
