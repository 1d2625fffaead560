"""Rank 0's mirror for one attempt of the built-in trainer (``trainer.mirror``; ``hpc_train.mirror``): a copy
each time a checkpoint or the final weights are on disk, and at the start (what an earlier attempt could not
copy), and a bounded wait at the attempt's end."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import cast

from hpc_train.config import Config
from hpc_train.core.errors import ConfigError
from hpc_train.core.records import MirroredFile
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import at_step
from hpc_train.mirror import Mirror
from hpc_train.mirror.sync import STORY
from hpc_train.runtime.outcome import Fit
from hpc_train.runtime.timeouts import mirror_wait_s
from hpc_train.train.checkpoint import Checkpoints
from hpc_train.train.hooks import StepObserver

__all__ = ["FAILURE_WAIT_S", "MirrorCopies", "close_mirror", "open_mirror", "resolve_hook", "script_outputs"]

FAILURE_WAIT_S = 10.0
"""After a failure, the copy in flight gets at most this long (or trainer.mirror_wait_s, if shorter): the restart
must not wait long for it."""


def resolve_hook(name: str) -> Callable[[Path], object]:
    """The function trainer.mirror_hook names; ConfigError, with the fix, when it cannot be found."""
    module, _, function = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"trainer.mirror_hook={name!r} is invalid: {exc}. HINT: name a function of a module rank 0 can import "
            "(installed, or on PYTHONPATH), e.g. trainer.mirror_hook=mylab.storage.copy_out"
        ) from None
    if not callable(found):
        raise ConfigError(f"trainer.mirror_hook={name!r} is invalid: {function} is not a function. HINT: name one")
    return cast(Callable[[Path], object], found)


NOT_OUTPUTS = frozenset({"logs", "status", "submitit", "wandb", "checkpoints"})
"""Folders of the run dir that are not a script's outputs: hpc_train's own records (copied as the run's story),
the ranks' logs, submitit's, and W&B's own files (``wandb sync`` uploads those)."""


def script_outputs(rd: RunDir) -> list[str]:
    """What a user's script wrote into the run dir, by path in it (hidden and temporary files left out): the part
    of its work that hpc_train can see and mirror."""
    found = []
    for path in sorted(rd.path.rglob("*")):
        parts = path.relative_to(rd.path).parts
        if parts[0] in NOT_OUTPUTS or any(p.startswith(".") for p in parts) or path.suffix in (".tmp", ".partial"):
            continue
        if path.is_file() and not path.is_symlink() and "/".join(parts) not in STORY:
            found.append("/".join(parts))
    return found


def open_mirror(rd: RunDir, cfg: Config) -> Mirror | None:
    """The run's mirror, on rank 0 (None when trainer.mirror and trainer.mirror_hook are off). For a user's script,
    it copies what the script wrote into the run dir (``script_outputs``) too."""
    tc = cfg.trainer
    if not tc.mirror and not tc.mirror_hook:
        return None
    hook = resolve_hook(tc.mirror_hook) if tc.mirror_hook else None

    def checkpoints() -> list[MirroredFile]:
        return [
            MirroredFile(name=f"checkpoints/{r.file}", sha256=r.sha256, size=r.size, time=r.time, step=r.step)
            for r in Checkpoints(rd).records()
        ]

    outputs = (lambda: script_outputs(rd)) if cfg.script.enabled else (lambda: ())
    return Mirror(rd, tc.mirror, tc.keep_checkpoints, checkpoints, hook=hook, hook_name=tc.mirror_hook, outputs=outputs)


def close_mirror(mirror: Mirror, cfg: Config, fit: Fit | None, world_size: int = 1) -> bool:
    """The attempt's end (``fit``; None: it failed): a last copy, waited for ``mirror_wait_s`` at most
    (FAILURE_WAIT_S after a failure). Whether it landed."""
    wait = mirror_wait_s(cfg, world_size)
    if fit is None:
        return mirror.close(min(wait, FAILURE_WAIT_S), "the failure")
    return mirror.close(wait, "the end of training" if fit.completed else f"the stop {at_step(fit.step)}")


class MirrorCopies(StepObserver):
    """Rank 0: asks ``mirror`` for a copy when training starts and each time a state is on disk."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def on_start(self, step: int) -> None:
        self.mirror.sync()

    def on_saved(self, step: int) -> None:
        self.mirror.sync()
