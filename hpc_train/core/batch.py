"""How a global batch splits over a number of ranks: the one rule the built-in trainer, a resumed run dir and a
user's script (``hpc_train.global_batch``) follow when the rank count changes. Pure, and light to import."""

from __future__ import annotations

__all__ = ["GLOBAL_BATCH_VARIABLE", "split_global_batch"]


def split_global_batch(global_batch: int, world_size: int, batch_size: int, accumulate: int) -> tuple[int, int] | None:
    """(per-rank batch, accumulation) that make ``global_batch`` on ``world_size`` ranks, or None when no whole
    numbers do. The per-rank batch is kept where it can be (memory per rank stays as it was), then the
    accumulation; otherwise the largest per-rank batch below the old one that divides the rank's share."""
    if global_batch % world_size:
        return None
    share = global_batch // world_size  # samples a rank takes per optimizer step
    if share % batch_size == 0:
        return batch_size, share // batch_size
    if share % accumulate == 0 and share // accumulate <= batch_size:
        return share // accumulate, accumulate
    smaller = next(b for b in range(min(batch_size, share), 0, -1) if share % b == 0)
    return smaller, share // smaller


GLOBAL_BATCH_VARIABLE = "HPC_TRAIN_GLOBAL_BATCH"
"""Set for a user's script with ``script.global_batch``: the samples of one optimizer step over all ranks, which
``hpc_train.global_batch.GlobalBatch`` splits over the ranks the script runs on today."""
