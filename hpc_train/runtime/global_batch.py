"""Your script's global batch and data order, kept on whatever nodes the queue gives (``script.global_batch``).

    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from hpc_train import preemption
    from hpc_train.global_batch import GlobalBatch

    dist.init_process_group("gloo")                       # your script sets up its own group, as under torchrun
    batch = GlobalBatch.of(per_rank=16, steps=600)        # today's share of script.global_batch (say 48)
    step = load_my_checkpoint()                           # optimizer steps done: 0 on the first attempt
    sampler = batch.sampler(len(dataset), seed=0, step=step)
    loader = DataLoader(dataset, batch_size=batch.per_rank, sampler=sampler)
    while step < batch.steps:
        for i, (x, y) in enumerate(loader):              # batch.accumulate micro-batches make one step
            loss = model(x, y) / batch.accumulate
            ...                                           # backward; optimizer step every batch.accumulate
        sampler.set_epoch(sampler.epoch + 1)

Under hpc_train with ``script.global_batch=G`` the script may train on fewer or more ranks than
``cluster.nodes`` gives (a node range, a lost node, growth, a run dir resumed on another node count). On any
rank count W that divides G, ``GlobalBatch.of`` keeps the script's ``per_rank`` batch where it can and
accumulates ``G / (W x per_rank)`` micro-batches a step; where that is not whole it takes a smaller per-rank
batch (``hpc_train.core.batch.split_global_batch``, the rule the built-in trainer follows). The sampler
(``GlobalBatchSampler``) gives global step t the positions [tG, (t+1)G) of one permutation of the data set
that depends on the seed and the epoch only, so every step trains on the same samples whatever W is, and a
resume at step t skips exactly the steps done. Without ``script.global_batch`` (or outside hpc_train, under
torchrun) the global batch is ``per_rank x accumulate x WORLD_SIZE``, and nothing changes.

What it cannot keep: anything random per rank (dropout masks, augmentations drawn on each rank) depends on the
rank count, and so does the order of floating-point sums, so weights agree to rounding, not bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from hpc_train.core.batch import GLOBAL_BATCH_VARIABLE, split_global_batch
from hpc_train.core.errors import ConfigError
from hpc_train.runtime import preemption

__all__ = ["GlobalBatch", "GlobalBatchSampler"]


@dataclass(frozen=True, kw_only=True)
class GlobalBatch:
    """One optimizer step's samples over all ranks (``size``), and this rank's part of it today."""

    size: int
    ranks: int
    """The ranks training now (WORLD_SIZE)."""
    rank: int
    per_rank: int
    """Samples a rank takes in one micro-batch (the DataLoader's batch_size)."""
    accumulate: int
    """Micro-batches a rank accumulates per optimizer step."""
    steps: int | None = None
    """The optimizer steps the run trains in all, as the script said (None: not said)."""

    @classmethod
    def of(cls, per_rank: int, accumulate: int = 1, steps: int | None = None) -> GlobalBatch:
        """This rank's part of the run's global batch: ``script.global_batch`` under hpc_train, else
        ``per_rank x accumulate x WORLD_SIZE``. ``per_rank`` and ``accumulate``: the script's own, kept where
        the rank count allows. ``steps``: the optimizer steps the run trains in all, which hpc_train's growth
        estimate needs to weigh the steps left (none: it does not grow the run)."""
        if per_rank < 1 or accumulate < 1:
            raise ValueError(f"per_rank={per_rank} and accumulate={accumulate} must be at least 1")
        ranks, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        given = os.environ.get(GLOBAL_BATCH_VARIABLE)
        size = int(given) if given else per_rank * accumulate * ranks
        split = split_global_batch(size, ranks, per_rank, accumulate)
        if split is None:  # hpc_train checks this before it starts the ranks; torchrun does not
            raise ConfigError(
                f"script.global_batch={size} does not split over the {ranks} ranks training now. HINT: make it a "
                f"multiple of every rank count the run may train on"
            )
        preemption.note_global_batch(steps)
        return cls(size=size, ranks=ranks, rank=rank, per_rank=split[0], accumulate=split[1], steps=steps)

    @classmethod
    def accumulating(
        cls, per_rank: int, accumulate: int, steps: int | None, batch_key: str, other_fix: str = ""
    ) -> GlobalBatch:
        """``of`` for a framework that fixes the per-rank batch (``batch_key``, named in the error) once it has
        built its loader: only the accumulation may change, so a share of the global batch that ``per_rank`` does
        not divide is a ConfigError (``other_fix``: one more way out, for its hint)."""
        batch = cls.of(per_rank=per_rank, accumulate=accumulate, steps=steps)
        if batch.per_rank != per_rank:
            share = batch.size // batch.ranks
            raise ConfigError(
                f"script.global_batch={batch.size} on the {batch.ranks} ranks training now is {share} samples a "
                f"rank a step, which {batch_key}={per_rank} does not divide, and the framework keeps its per-rank "
                f"batch once its loader is built. HINT: set {batch_key} to a number that divides "
                f"script.global_batch / ranks for every rank count the run may train on (here {share}), "
                f"{other_fix + ', ' if other_fix else ''}or keep the node count fixed (drop cluster.min_nodes)"
            )
        return batch

    def sampler(self, samples: int, seed: int = 0, step: int = 0, shuffle: bool = True) -> GlobalBatchSampler:
        """This rank's sampler over a data set of ``samples`` items, from optimizer step ``step`` on (the steps
        a resumed run has done)."""
        return GlobalBatchSampler(
            samples, size=self.size, ranks=self.ranks, rank=self.rank, seed=seed, step=step, shuffle=shuffle
        )

    def describe(self) -> str:
        return (
            f"global batch {self.size} = {self.per_rank} a rank x {self.ranks} rank{'s' if self.ranks != 1 else ''} "
            f"x {self.accumulate} accumulated"
        )


class GlobalBatchSampler(torch.utils.data.Sampler[int]):
    """Rank ``rank``'s items: of each global step's ``size`` positions in the epoch's permutation, its slice of
    ``size / ranks``, in order. An epoch is the data set's whole global batches (the rest, fewer than ``size``
    items, is left out: every step is a full one, on any rank count). ``step``: optimizer steps done, which
    the first epoch iterated skips."""

    def __init__(
        self, samples: int, *, size: int, ranks: int, rank: int, seed: int = 0, step: int = 0, shuffle: bool = True
    ) -> None:
        if size % ranks or not 0 <= rank < ranks:
            raise ValueError(f"a global batch of {size} does not split over {ranks} ranks, or rank {rank} is not one")
        self.steps_per_epoch = samples // size
        if self.steps_per_epoch == 0:
            raise ValueError(f"a data set of {samples} items holds no global batch of {size}")
        self.samples, self.size, self.share, self.rank = samples, size, size // ranks, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self._skip = divmod(step, self.steps_per_epoch)

    def set_epoch(self, epoch: int) -> None:
        """The epoch to iterate next; another epoch than the resumed one starts at its first step."""
        if epoch != self.epoch:
            self.epoch, self._skip = epoch, 0

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(self.samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.samples)
        for step in range(self._skip, self.steps_per_epoch):
            start = step * self.size + self.rank * self.share
            yield from order[start : start + self.share].tolist()

    def __len__(self) -> int:
        return (self.steps_per_epoch - self._skip) * self.share
