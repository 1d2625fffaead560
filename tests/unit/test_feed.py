"""The input path (``hpc_train.train.feed``): a set kept where the model is gives the DataLoader's batches, in
its order, with its random-state draws; which sets may be kept there, and the config's rules.

On the CPU: ``data.on_device=true`` keeps the set in host memory and gathers there, which is the same code as on
a GPU but for the device. The GPU side (the side-stream copies, the automatic choice) is in tests/gpu."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hpc_train.config import DataConfig
from hpc_train.core.errors import ConfigError
from hpc_train.train.data import (
    BatchedTensorDataset,
    ResumableSampler,
    kept_on_device,
    make_loaders,
    make_synthetic,
)
from hpc_train.train.feed import DeviceBatches, tensor_set

from .test_process_group import env_with

CPU = torch.device("cpu")


def _passes(loader: object, epochs: int = 2) -> list[list[tuple[torch.Tensor, ...]]]:
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        out.append([tuple(batch) for batch in loader])  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("rank", [0, 2])
def test_kept_sets_give_the_dataloaders_batches_and_draws(drop_last: bool, rank: int) -> None:
    cfg = DataConfig(num_samples=1000, val_fraction=0.1, input_shape=[3, 4, 4], num_classes=5, drop_last=drop_last)
    train, val = make_synthetic(cfg)
    for on_device in (False, True):
        cfg.on_device = on_device
        torch.manual_seed(7)
        loader, sampler, val_loader, generator = make_loaders(train, val, cfg, 64, 3, env_with(rank, 3), CPU)
        assert isinstance(loader, DeviceBatches) is on_device and isinstance(val_loader, DeviceBatches) is on_device
        sampler.skip = 5 * 64  # a resumed run's first pass starts 5 batches in
        batches = _passes(loader)
        val_batches = [tuple(b) for b in val_loader]  # type: ignore[union-attr]
        drawn = torch.rand(1)  # the validation loader draws from the global generator at each pass, as DataLoader
        if not on_device:
            expected = batches, val_batches, len(loader), len(val_loader), generator.get_state(), drawn  # type: ignore[arg-type]
            continue
        assert (len(loader), len(val_loader)) == expected[2:4]  # type: ignore[arg-type]
        assert torch.equal(generator.get_state(), expected[4]) and torch.equal(drawn, expected[5])
        for got, want in zip([*batches, val_batches], [*expected[0], expected[1]], strict=True):
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_plain_tensor_dataset_of_a_users_data_is_kept_too() -> None:
    """Default collation stacks samples one by one; the gather gives the same tensors."""
    x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    cfg = DataConfig(on_device=True, drop_last=False)
    train = TensorDataset(x, y)
    host = DataLoader(train, batch_size=32, sampler=ResumableSampler(train, 2, 1, seed=4))
    kept = DeviceBatches((x, y), ResumableSampler(train, 2, 1, seed=4), 32, CPU)
    assert kept_on_device(train, None, cfg, CPU) == ((x, y), None)
    for a, b in zip(host, kept, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


class Squared(TensorDataset):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] ** 2 for t in self.tensors)


class Listed(Dataset[int]):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> int:
        return index


def test_only_plain_tensor_sets_are_kept_and_asking_for_others_names_the_fix() -> None:
    x = torch.ones(4, 2)
    assert tensor_set(BatchedTensorDataset(x)) == (x,)
    assert tensor_set(Squared(x)) is None  # its own __getitem__ would be skipped by a gather
    assert kept_on_device(Squared(x), None, DataConfig(on_device=None), CPU) is None  # the CPU: off by default
    assert kept_on_device(TensorDataset(x), None, DataConfig(on_device=False), CPU) is None
    cfg = DataConfig(on_device=True, dataset={"_target_": "mine.make"})
    with pytest.raises(ConfigError, match=r"data.on_device=true: .*'mine.make'.* Listed, not a TensorDataset.*HINT"):
        kept_on_device(Listed(), None, cfg, CPU)
    (train,), val = kept_on_device(TensorDataset(x), Listed(), cfg, CPU)  # type: ignore[misc]
    assert train is x and val is None  # a validation set that is no tensor set goes through a DataLoader


def test_a_kept_set_is_read_without_workers() -> None:
    with pytest.raises(ConfigError, match=r"data.on_device.*num_workers=2.*HINT: set data.num_workers=0"):
        DataConfig(on_device=True, num_workers=2)
    assert DataConfig(on_device=None, num_workers=2).on_device is None
