"""The groups with one schema per option, chosen by the option's ``name``: ``model`` (mlp, cnn, transformer; or
your own ``_target_``, kept as a mapping) and ``optim`` (adamw, sgd)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hpc_train.config.checks import F32, FLOAT32_MAX, INT64_MAX, Checked

__all__ = [
    "MODEL_SCHEMAS",
    "OPTIM_SCHEMAS",
    "AdamWConfig",
    "CNNConfig",
    "MLPConfig",
    "SGDConfig",
    "TransformerConfig",
]


@dataclass
class MLPConfig(Checked):
    """Fully connected classifier on flattened inputs."""

    _group: ClassVar[str] = "model"

    name: str = "mlp"
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Width of each hidden layer."""
    dropout: float = 0.0
    """Dropout after each hidden layer."""

    def __post_init__(self) -> None:
        self._require(
            all(1 <= h <= INT64_MAX for h in self.hidden_sizes),
            "hidden_sizes",
            "sizes must be positive (at most 2**63-1)",
            "e.g. model.hidden_sizes=[1024,1024]",
        )
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class CNNConfig(Checked):
    """Small convolutional classifier for [C, H, W] inputs: conv-relu-pool blocks, then a linear head."""

    _group: ClassVar[str] = "model"

    name: str = "cnn"
    channels: list[int] = field(default_factory=lambda: [32, 64])
    """Output channels of each conv block (each block halves H and W)."""
    hidden_size: int = 128
    """Width of the hidden layer of the head."""
    dropout: float = 0.0
    """Dropout before the last layer."""

    def __post_init__(self) -> None:
        self._require(
            len(self.channels) >= 1 and all(1 <= c <= INT64_MAX for c in self.channels),
            "channels",
            "must be a non-empty list of positive sizes (at most 2**63-1)",
            "e.g. model.channels=[32,64]",
        )
        self._bounded("hidden_size", 1, INT64_MAX, 128, why="2**63-1")
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class TransformerConfig(Checked):
    """A small transformer encoder classifier for [tokens, features] inputs: embed, encode, mean-pool, classify."""

    _group: ClassVar[str] = "model"

    name: str = "transformer"
    d_model: int = 64
    """Width of the token embeddings."""
    nhead: int = 4
    """Attention heads (must divide d_model)."""
    num_layers: int = 2
    """Encoder layers."""
    dim_feedforward: int = 128
    """Width of each layer's feed-forward block."""
    dropout: float = 0.0
    """Dropout inside the encoder layers."""

    def __post_init__(self) -> None:
        for key in ("d_model", "nhead", "num_layers", "dim_feedforward"):
            self._bounded(key, 1, INT64_MAX, 2, why="2**63-1")
        self._require(
            self.d_model % self.nhead == 0,
            "nhead",
            f"must divide model.d_model={self.d_model}",
            "e.g. model.d_model=64 model.nhead=4",
        )
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class AdamWConfig(Checked):
    """torch.optim.AdamW; the learning rate comes from trainer.lr."""

    _group: ClassVar[str] = "optim"

    name: str = "adamw"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    fused: bool | None = None
    """One fused kernel for the whole update instead of a few per parameter group. None: fused when the
    parameters are on a GPU (fewer kernel launches per step), the multi-tensor (foreach) kernels on CPU."""

    def __post_init__(self) -> None:
        self._require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            "must be two numbers in [0, 1)",
            "e.g. optim.betas=[0.9,0.999]",
        )
        self._bounded("eps", 0.0, FLOAT32_MAX, "1e-8", why=F32)
        self._bounded("weight_decay", 0.0, FLOAT32_MAX, 0.01, why=F32)


@dataclass
class SGDConfig(Checked):
    """torch.optim.SGD; the learning rate comes from trainer.lr."""

    _group: ClassVar[str] = "optim"

    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self._require(0 <= self.momentum < 1, "momentum", "must be in [0, 1)", "e.g. optim.momentum=0.9")
        self._require(
            not self.nesterov or self.momentum > 0,
            "nesterov",
            "Nesterov momentum needs optim.momentum > 0",
            "set optim.momentum=0.9 or optim.nesterov=false",
        )
        self._bounded("weight_decay", 0.0, FLOAT32_MAX, 0, why=F32)


MODEL_SCHEMAS: dict[str, type[Any]] = {"mlp": MLPConfig, "cnn": CNNConfig, "transformer": TransformerConfig}
OPTIM_SCHEMAS: dict[str, type[Any]] = {"adamw": AdamWConfig, "sgd": SGDConfig}
