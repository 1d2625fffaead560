"""Per-rank logging: every rank to ``logs/rank_<r>.log``, rank 0 also to the console, others only warnings."""

from __future__ import annotations

import logging
import os
import sys

from hpc_train.core.rundir import RunDir
from hpc_train.distributed import DistEnv, detect_source

__all__ = ["setup_logging"]


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes through tqdm so log lines do not tear rank 0's progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        # tqdm only where a progress bar is drawn
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never kill training
            self.handleError(record)


def setup_logging(rd: RunDir, env: DistEnv, attempt: int) -> None:
    """Route the ``hpc_train`` loggers of this rank to its log file of this attempt, and to the console."""
    rd.logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(name)s: %(message)s")
    file_handler = logging.FileHandler(rd.rank_log(env.rank, attempt))
    file_handler.setFormatter(fmt)
    console = _ConsoleHandler()
    console.setFormatter(logging.Formatter(f"[rank {env.rank}] %(message)s"))
    console.setLevel(logging.INFO if env.is_main else logging.WARNING)
    root = logging.getLogger("hpc_train")
    root.setLevel(logging.INFO)
    root.propagate = False
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(file_handler)
    root.addHandler(console)
    _, why = detect_source(os.environ)
    logging.getLogger("hpc_train.distributed.env").info("rank resolution: source=%s (%s): %s", env.source, why, env)
