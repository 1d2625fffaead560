"""Preemption-safe training for trainers that are not ours: a callback per framework, imported lazily.

- ``hpc_train.integrations.transformers.PreemptionCallback`` (``pip install 'hpc-train[transformers]'``)
- ``hpc_train.integrations.lightning.PreemptionCallback`` (``pip install 'hpc-train[lightning]'``)
- plain loops: ``hpc_train.preemption.should_stop()``

Each callback follows the same protocol as ``should_stop``: the signal handler only sets a flag, every rank
agrees at the next optimizer step, the framework writes its own complete checkpoint on every rank that takes
part, training stops, and the script exits 0, which tells hpc_train to requeue the job. The relaunched script
resumes from ``last_checkpoint(...)``, the newest checkpoint that was written completely.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["newest"]


def newest(directory: str | os.PathLike[str], pattern: str, complete: str | None = None) -> str | None:
    """The entry of ``directory`` matching ``pattern`` (one group: the step) with the highest step, skipping any
    that lacks the file ``complete`` inside it; None when there is none (a first attempt)."""
    folder = Path(directory)
    if not folder.is_dir():
        return None
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(pattern, entry.name)
        if match and (complete is None or (entry / complete).is_file()):
            found.append((int(match.group(1)), entry))
    return str(max(found)[1]) if found else None
