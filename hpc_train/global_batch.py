"""Your script's global batch and data order on whatever nodes the queue gives: ``hpc_train.runtime.global_batch``
under its public name (``from hpc_train.global_batch import GlobalBatch``)."""

from hpc_train.runtime.global_batch import GlobalBatch, GlobalBatchSampler

__all__ = ["GlobalBatch", "GlobalBatchSampler"]
