"""Synthetic data and the samplers that shard it across ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from hpc_train.config import DataConfig
from hpc_train.dist import DistEnv

__all__ = ["ShardSampler", "make_loaders", "make_synthetic"]


def make_synthetic(cfg: DataConfig) -> tuple[TensorDataset, TensorDataset]:
    """Train and validation sets drawn from class-conditional Gaussians.

    Each class c gets a random mean of norm ``cfg.class_separation``; a sample of class c is that mean plus
    N(0, I) noise. Classes overlap, so accuracy saturates below 100%, and a model learns the task from a few
    hundred samples per class (it generalises, unlike random labels). Everything comes from ``cfg.seed``, so
    every rank builds the same tensors without communicating.
    """
    g = torch.Generator().manual_seed(cfg.seed)
    shape = [int(d) for d in cfg.input_shape]
    dim = math.prod(shape)
    means = torch.randn(cfg.num_classes, dim, generator=g)
    means *= cfg.class_separation / means.norm(dim=1, keepdim=True)
    y = torch.randint(cfg.num_classes, (cfg.num_samples,), generator=g)
    x = (means[y] + torch.randn(cfg.num_samples, dim, generator=g)).reshape(cfg.num_samples, *shape)
    return TensorDataset(x[cfg.num_val :], y[cfg.num_val :]), TensorDataset(x[: cfg.num_val], y[: cfg.num_val])


class ShardSampler(Sampler[int]):
    """Rank r of w takes samples r, r+w, r+2w, ...: no padding, no sample twice, so sums over ranks are exact.

    DistributedSampler pads the last shard with repeated samples so every rank has the same count; that is
    right for training (equal step counts) but would count those samples twice in validation metrics.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.length, self.rank, self.world_size = length, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


def make_loaders(
    train: TensorDataset,
    val: TensorDataset,
    cfg: DataConfig,
    batch_size: int,
    seed: int,
    env: DistEnv,
    pin_memory: bool,
) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DistributedSampler[int], DataLoader[tuple[torch.Tensor, ...]]]:
    """The training loader (shuffled by a DistributedSampler seeded with ``seed``) and the validation loader.

    With one rank, batch 2B sees the same samples per step as two ranks with batch B each: the sampler's
    permutation depends only on seed and epoch, and rank r takes every w-th index of it.
    """
    sampler: DistributedSampler[int] = DistributedSampler(
        train, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed, drop_last=False
    )
    workers, persistent = cfg.num_workers, cfg.num_workers > 0
    train_loader = DataLoader(
        train,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=cfg.drop_last,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent,
    )
    val_loader = DataLoader(
        val,
        batch_size=batch_size,
        sampler=ShardSampler(len(val), env.rank, env.world_size),
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent,
    )
    return train_loader, sampler, val_loader
