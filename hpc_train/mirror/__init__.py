"""Results that outlive scratch: a run's verified checkpoints, final weights and story copied to a second store
(``trainer.mirror``: a path or an fsspec URL), and the way back from it. On config and core only; fsspec (and
s3fs for ``s3://``) is imported when a mirror is configured."""

from hpc_train.mirror.store import Store, is_url
from hpc_train.mirror.sync import LEDGER, Mirror, MirrorError, read_ledger, restore_newest

__all__ = ["LEDGER", "Mirror", "MirrorError", "Store", "is_url", "read_ledger", "restore_newest"]
