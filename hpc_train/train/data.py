"""Synthetic data and the samplers that shard it across ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from hpc_train.config import DataConfig
from hpc_train.dist import DistEnv

__all__ = ["ShardSampler", "make_datasets", "make_loaders", "make_synthetic"]


def make_datasets(cfg: DataConfig) -> tuple[Dataset[Any], Dataset[Any] | None]:
    """The user's data (``data.dataset``) or the synthetic set; the validation set may be None."""
    if cfg.dataset is not None:
        from hpc_train.train.usercode import call_target, split_datasets

        return split_datasets(call_target(cfg.dataset, "data.dataset"), cfg.dataset["_target_"])
    train, val = make_synthetic(cfg)
    return train, (val if len(val) else None)


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
    train: Dataset[Any], val: Dataset[Any] | None, cfg: DataConfig, batch_size: int, seed: int, env: DistEnv, cuda: bool
) -> tuple[DataLoader[Any], DistributedSampler[Any], DataLoader[Any] | None]:
    """The training loader (shuffled by a DistributedSampler seeded with ``seed``) and the validation loader.

    With one rank, batch 2B sees the same samples per step as two ranks with batch B each: the sampler's
    permutation depends only on seed and epoch, and rank r takes every w-th index of it.
    """
    sampler: DistributedSampler[Any] = DistributedSampler(
        train, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed, drop_last=False
    )
    options: dict[str, Any] = {
        "num_workers": cfg.num_workers,
        "pin_memory": cuda if cfg.pin_memory is None else cfg.pin_memory,
    }
    if cfg.num_workers > 0:  # both are errors for DataLoader without workers
        options |= {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": cfg.persistent_workers}
    train_loader = DataLoader(train, batch_size=batch_size, sampler=sampler, drop_last=cfg.drop_last, **options)
    if val is None:
        return train_loader, sampler, None
    shard = ShardSampler(len(cast(Sized, val)), env.rank, env.world_size)
    return train_loader, sampler, DataLoader(val, batch_size=batch_size, sampler=shard, **options)
