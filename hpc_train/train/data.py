"""Synthetic data and the samplers that shard it across ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from hpc_train.config import DataConfig
from hpc_train.core.errors import ConfigError
from hpc_train.distributed import DistEnv
from hpc_train.train.feed import ON_DEVICE_SHARE, BatchedTensorDataset, DeviceBatches, as_batch, set_bytes, tensor_set

__all__ = [
    "SYNTHETIC_VERSION",
    "BatchedTensorDataset",
    "Loader",
    "ResumableSampler",
    "ShardSampler",
    "kept_on_device",
    "make_datasets",
    "make_loaders",
    "make_synthetic",
]

SYNTHETIC_VERSION = 2
"""The synthetic set's generator, recorded in checkpoints: 2 draws smooth means for image shapes (1 drew
white-noise means for every shape). A run trained on one resumes only on the same data."""
IMAGE_GRID = 4
"""Image class means vary over cells of IMAGE_GRID x IMAGE_GRID pixels."""
_ADD_CHUNK = 2048
"""Rows per in-place addition in make_synthetic (a few MB of temporary memory)."""


def make_datasets(cfg: DataConfig) -> tuple[Dataset[Any], Dataset[Any] | None]:
    """The user's data (``data.dataset``) or the synthetic set; the validation set may be None."""
    if cfg.dataset is not None:
        # Hydra's instantiate only for a user's own data
        from hpc_train.train.usercode import call_target, split_datasets

        return split_datasets(call_target(cfg.dataset, "data.dataset"), cfg.dataset["_target_"])
    train, val = make_synthetic(cfg)
    return train, (val if len(val) else None)


def make_synthetic(cfg: DataConfig) -> tuple[BatchedTensorDataset, BatchedTensorDataset]:
    """Train and validation sets drawn from class-conditional Gaussians.

    Each class c gets a random mean of norm ``cfg.class_separation``; a sample of class c is that mean plus
    N(0, I) noise. Classes overlap, so accuracy saturates below 100%, and a model learns the task from a few
    hundred samples per class (it generalises, unlike random labels). Everything comes from ``cfg.seed``, so
    every rank builds the same tensors without communicating.
    """
    g = torch.Generator().manual_seed(cfg.seed)
    shape = [int(d) for d in cfg.input_shape]
    dim = math.prod(shape)
    means = _class_means(cfg.num_classes, shape, g)
    means *= cfg.class_separation / means.norm(dim=1, keepdim=True)
    y = torch.randint(cfg.num_classes, (cfg.num_samples,), generator=g)
    x = torch.randn(cfg.num_samples, dim, generator=g)
    # The class means are added in place, a slice at a time: `means[y] + noise` would make two more tensors the
    # size of the data set, which every rank pays for before its first step (docs/performance.md). Same numbers:
    # the draws come in the same order.
    for start in range(0, cfg.num_samples, _ADD_CHUNK):
        x[start : start + _ADD_CHUNK] += means[y[start : start + _ADD_CHUNK]]
    x = x.reshape(cfg.num_samples, *shape)
    train, val = (x[cfg.num_val :], y[cfg.num_val :]), (x[: cfg.num_val], y[: cfg.num_val])
    return BatchedTensorDataset(*train), BatchedTensorDataset(*val)


def _class_means(classes: int, shape: list[int], g: torch.Generator) -> torch.Tensor:
    """One random mean per class, flattened. For an image shape [C, H, W] the means are smooth images (drawn on
    a grid IMAGE_GRID times coarser, then repeated over each cell): a per-pixel white-noise mean would be
    averaged away by a convolutional model's pooling, and a CNN would stay at chance on it."""
    if len(shape) != 3 or min(shape[1:]) < IMAGE_GRID:
        return torch.randn(classes, math.prod(shape), generator=g)
    channels, height, width = shape
    coarse = torch.randn(classes, channels, -(-height // IMAGE_GRID), -(-width // IMAGE_GRID), generator=g)
    full = coarse.repeat_interleave(IMAGE_GRID, dim=2).repeat_interleave(IMAGE_GRID, dim=3)
    return full[:, :, :height, :width].reshape(classes, -1).contiguous()


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


class ResumableSampler(DistributedSampler[Any]):
    """DistributedSampler that can start its next pass ``skip`` samples in: a resumed run continues mid-epoch
    with exactly the samples the interrupted one had not reached, without loading the ones before."""

    skip = 0

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])


Loader = DataLoader[Any] | DeviceBatches
"""What the trainer reads batches from: a DataLoader, or an in-memory set kept on the device (``data.on_device``)."""


def make_loaders(
    train: Dataset[Any],
    val: Dataset[Any] | None,
    cfg: DataConfig,
    batch_size: int,
    seed: int,
    env: DistEnv,
    device: torch.device,
) -> tuple[Loader, ResumableSampler, Loader | None, torch.Generator]:
    """The training loader (shuffled by a DistributedSampler seeded with ``seed``), the validation loader and
    the training loader's own generator (DataLoader draws its workers' base seed from it once per epoch;
    without one it would draw from the global random state, which dropout uses too).

    With one rank, batch 2B sees the same samples per step as two ranks with batch B each: the sampler's
    permutation depends only on seed and epoch, and rank r takes every w-th index of it.

    A set kept on the device (``data.on_device``: ``kept_on_device``) is read by a ``DeviceBatches`` with the
    same sampler and generator: the same batches.
    """
    sampler = ResumableSampler(
        train, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed, drop_last=False
    )
    generator = torch.Generator().manual_seed(seed + env.rank)
    train_tensors, val_tensors = kept_on_device(train, val, cfg, device) or (None, None)
    options: dict[str, Any] = {
        "num_workers": cfg.num_workers,
        "pin_memory": device.type == "cuda" if cfg.pin_memory is None else cfg.pin_memory,
    }
    if isinstance(train, BatchedTensorDataset):
        options["collate_fn"] = as_batch
    if cfg.num_workers > 0:  # both are errors for DataLoader without workers
        options |= {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": cfg.persistent_workers}
    train_loader: Loader
    if train_tensors is not None:
        train_loader = DeviceBatches(train_tensors, sampler, batch_size, device, cfg.drop_last, generator)
    else:
        train_loader = DataLoader(
            train, batch_size=batch_size, sampler=sampler, drop_last=cfg.drop_last, generator=generator, **options
        )
    if val is None:
        return train_loader, sampler, None, generator
    shard = ShardSampler(len(cast(Sized, val)), env.rank, env.world_size)
    if val_tensors is not None:
        return train_loader, sampler, DeviceBatches(val_tensors, shard, batch_size, device), generator
    return train_loader, sampler, DataLoader(val, batch_size=batch_size, sampler=shard, **options), generator


def kept_on_device(
    train: Dataset[Any], val: Dataset[Any] | None, cfg: DataConfig, device: torch.device
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None] | None:
    """The tensors of the training set (and of the validation set, where it is one too) to keep on the device,
    or None to load through a DataLoader (``data.on_device``). ConfigError for data.on_device=true with a
    training set that is not an in-memory tensor set."""
    if cfg.on_device is False or (cfg.on_device is None and (device.type != "cuda" or cfg.num_workers)):
        return None
    train_tensors = tensor_set(train)
    val_tensors = None if val is None else tensor_set(val)
    if train_tensors is None:
        if cfg.on_device:
            where = f"data.dataset._target_={cfg.dataset['_target_']!r}" if cfg.dataset is not None else "the data"
            raise ConfigError(
                f"data.on_device=true: the training set from {where} is a {type(train).__name__}, not a "
                "TensorDataset; only in-memory tensor sets are kept on the device. HINT: return a "
                "torch.utils.data.TensorDataset, or set data.on_device=false (batches are then copied to the GPU "
                "one ahead)"
            )
        return None
    if cfg.on_device is None:
        free, _ = torch.cuda.mem_get_info(device)
        if set_bytes(train_tensors) + set_bytes(val_tensors or ()) > ON_DEVICE_SHARE * free:
            return None
    return train_tensors, val_tensors
