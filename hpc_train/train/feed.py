"""The input path to the device: batches of an in-memory set gathered where the model is (``DeviceBatches``,
``data.on_device``), or a loader's host batches copied one ahead on a stream of their own (``DeviceFeed``).

Both give the same batches, in the same order, with the same values as the DataLoader on the host: a gather is
exact, and the sampler and the loader's generator are used as the DataLoader uses them. Only where the work
happens changes, so a run is bit-identical with either, and resumes on either.

On a CPU nothing here is used unless asked for (``data.on_device=true``): the DataLoader path is today's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import Dataset, Sampler, TensorDataset

__all__ = ["ON_DEVICE_SHARE", "BatchedTensorDataset", "DeviceBatches", "DeviceFeed", "as_batch", "tensor_set"]

ON_DEVICE_SHARE = 0.25
"""``data.on_device`` left to the default keeps an in-memory set on the GPU when it takes at most this share of
the GPU's free memory at start-up; the rest stays for the model, its optimizer and activations."""


class BatchedTensorDataset(TensorDataset):
    """In-memory tensors that the DataLoader reads a whole batch at a time.

    DataLoader's default path reads B samples one by one and stacks them: for an MLP batch of 256 that was about
    15% of a single-rank step on CPU. ``__getitems__`` (which DataLoader calls when a dataset has it) gathers
    the batch with one indexing op per tensor instead; the loader passes it through ``as_batch``.
    """

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(t[index] for t in self.tensors)


def as_batch(batch: Any) -> Any:
    """The collate function for BatchedTensorDataset: its batches are already stacked."""
    return batch


def tensor_set(dataset: Dataset[Any] | None) -> tuple[torch.Tensor, ...] | None:
    """The tensors of a set that is exactly a ``TensorDataset`` (or hpc_train's own ``BatchedTensorDataset``),
    else None. A subclass may change what an item is (a transform in ``__getitem__``), so only these two are
    read by gathering their tensors."""
    if type(dataset) not in (TensorDataset, BatchedTensorDataset):
        return None
    tensors = cast(TensorDataset, dataset).tensors
    return tensors if all(isinstance(t, torch.Tensor) for t in tensors) else None


def set_bytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class DeviceBatches:
    """A loader over tensors kept on ``device``: each pass copies the sampler's order there once, and each batch
    is one gather per tensor. It stands where a DataLoader without workers would, and matches it: batches of
    ``batch_size`` consecutive sampler indices (the last one dropped when short and ``drop_last``), and one draw
    from ``generator`` (the global generator when None) at each pass, as a DataLoader makes for its workers'
    seed, so the saved random states do not depend on which loader ran."""

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        sampler: Sampler[int],
        batch_size: int,
        device: torch.device,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.tensors = tuple(t.to(device) for t in tensors)
        self.sampler, self.batch_size, self.device = sampler, batch_size, device
        self.drop_last, self.generator = drop_last, generator
        self.dataset = BatchedTensorDataset(*self.tensors)
        """The set on the device (what ``DataLoader.dataset`` would be)."""
        self.collate_fn = as_batch

    def __len__(self) -> int:
        count = len(cast(Sized, self.sampler))
        return count // self.batch_size if self.drop_last else math.ceil(count / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        order = torch.as_tensor(list(self.sampler), dtype=torch.int64)
        if self.drop_last:
            order = order[: len(order) // self.batch_size * self.batch_size]
        return self._batches(order.to(self.device))

    def _batches(self, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            yield tuple(t[index] for t in self.tensors)


class DeviceFeed:
    """A loader's batches, each copied to a CUDA device one batch ahead on a stream of its own: the copy of the
    next batch runs beside the current step's kernels instead of before them. Tensors in a batch (a tuple or list
    of them; other values pass as they are) arrive on the device; the training stream waits for their copy
    before it uses them, and the allocator is told they are used there (``record_stream``)."""

    _END = object()

    def __init__(self, batches: Iterator[Any], device: torch.device) -> None:
        self._batches = batches
        self.device = device
        self._stream = torch.cuda.Stream(device)
        self._ahead: Any = self._load()

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> Any:
        batch = self._ahead
        if batch is self._END:
            raise StopIteration
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self._stream)
        for item in _tensors(batch):
            item.record_stream(current)
        self._ahead = self._load()
        return batch

    def _load(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            return self._END
        with torch.cuda.stream(self._stream):
            if type(batch) in (tuple, list):
                return type(batch)(_moved(item, self.device) for item in batch)
            return _moved(batch, self.device)


def _moved(item: Any, device: torch.device) -> Any:
    return item.to(device, non_blocking=True) if isinstance(item, torch.Tensor) else item


def _tensors(batch: Any) -> list[torch.Tensor]:
    items = batch if type(batch) in (tuple, list) else [batch]
    return [item for item in items if isinstance(item, torch.Tensor) and item.device.type == "cuda"]
