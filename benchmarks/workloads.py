"""The benchmark's workloads, written in plain PyTorch so every variant trains exactly the same thing.

hpc_train trains them through its own config (``hpc_train_overrides``); the reference DDP loop, the Lightning
module and the pure compute loop build them here. tests/unit/test_benchmarks.py checks that both sides build
the same layers with the same parameter count.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["LOG_EVERY", "WORKLOADS", "Workload", "measure_marks", "parse_args", "report", "synthetic"]

LOG_EVERY = 10
"""Every variant reads its loss (a host sync) every LOG_EVERY steps, as a hand-written loop that prints does."""


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


class _Transformer(nn.Module):
    """hpc_train's TransformerClassifier written out: linear token embedding, learned positions, a pre-norm
    encoder, mean pooling, a linear head (same parameter names, so the unit test can compare them)."""

    def __init__(self, tokens: int, features: int, d_model: int, nhead: int, ff: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, d_model)
        self.position = nn.Parameter(torch.zeros(1, tokens, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, ff, 0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.encoder(self.embed(x) + self.position).mean(dim=1))  # calls give Any
        return logits


_TOKENS, _FEATURES, _D_MODEL, _HEADS, _FF, _LAYERS = 128, 64, 768, 12, 3072, 6
"""Sized for a GPU (a BERT-base-like encoder, ~43M parameters, 8192 tokens a step): the MLP and CNN are so
small there that a step is mostly kernel launches."""


def _transformer() -> nn.Module:
    return _Transformer(_TOKENS, _FEATURES, _D_MODEL, _HEADS, _FF, _LAYERS)


@dataclass(frozen=True)
class Workload:
    """A model, its input shape and the per-rank batch size; AdamW (lr 1e-3) and cross-entropy throughout."""

    name: str
    input_shape: tuple[int, ...]
    batch_size: int
    build: Callable[[], nn.Module]
    hpc_train_overrides: tuple[str, ...]

    def samples_needed(self, steps: int, world_size: int) -> int:
        """Training samples for ``steps`` full batches on every rank: the run stays inside one epoch."""
        return steps * self.batch_size * world_size


WORKLOADS = {
    "mlp": Workload(
        "mlp", (784,), 256, _mlp, ("model=mlp", "model.hidden_sizes=[1024,1024]", "data.input_shape=[784]")
    ),
    "cnn": Workload(
        "cnn",
        (3, 32, 32),
        128,
        _cnn,
        ("model=cnn", "model.channels=[32,64]", "model.hidden_size=128", "data.input_shape=[3,32,32]"),
    ),
    "transformer": Workload(
        "transformer",
        (_TOKENS, _FEATURES),
        64,
        _transformer,
        (
            "model=transformer",
            f"model.d_model={_D_MODEL}",
            f"model.nhead={_HEADS}",
            f"model.dim_feedforward={_FF}",
            f"model.num_layers={_LAYERS}",
            f"data.input_shape=[{_TOKENS},{_FEATURES}]",
        ),
    ),
}


def synthetic(workload: Workload, samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and labels: throughput does not depend on what the numbers are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, math.prod(workload.input_shape), generator=g).reshape(samples, *workload.input_shape)
    return x, torch.randint(10, (samples,), generator=g)


def measure_marks(warmup: int, steps: int) -> tuple[int, int]:
    """The steps whose end opens and closes the throughput window; both fall on a logging step."""
    if warmup % LOG_EVERY or steps % LOG_EVERY or warmup <= 0 or steps <= 0:
        raise ValueError(f"warmup={warmup} and steps={steps} must be positive multiples of {LOG_EVERY}")
    return warmup, warmup + steps


def report(first_step_unix: float, window_s: float, window_samples: int) -> None:
    """The one line the benchmark driver reads from a variant's stdout."""
    result = {"first_step_unix": first_step_unix, "window_s": window_s, "window_samples": window_samples}
    print("BENCH_RESULT " + json.dumps(result), flush=True)


def parse_args(doc: str | None, extra: tuple[tuple[str, int], ...] = ()) -> argparse.Namespace:
    """The options every variant takes (the driver passes the same ones to all), plus ``extra`` integer options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    for name, default in extra:
        parser.add_argument(f"--{name}", type=int, default=default)
    return parser.parse_args()
