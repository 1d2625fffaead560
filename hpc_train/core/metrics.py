"""metrics.jsonl: one JSON object per log or validation step, appended and flushed by rank 0."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from hpc_train.core.files import atomic_write

__all__ = ["MetricsWriter", "drop_rows_after", "last_metrics", "metric_keys", "read_metrics"]

LOSSES = ("train_loss", "val_loss")
"""The columns every table of results starts with."""
BOOKKEEPING = frozenset(
    {"step", "epoch", "lr", "samples_per_s", "time_s", "first_step_at", "cuda_max_mem_mb", "val_samples"}
)
"""Keys of a row that describe the training rather than score the model."""


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


class MetricsWriter:
    """Appends rows to a JSONL file; a no-op on ranks other than 0."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self._file: IO[str] | None = path.open("a") if enabled else None

    def write(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(_line(row))
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics.jsonl file (none if it does not exist yet).

    Rank 0 appends while others read, so a last line still being written is skipped, not an error.
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def last_metrics(path: Path) -> dict[str, Any]:
    """The latest value of every metric (validation rows and train rows come at different steps)."""
    merged: dict[str, Any] = {}
    for row in read_metrics(path):
        merged.update(row)
    return merged


def drop_rows_after(path: Path, step: int) -> None:
    """Keep only the rows up to ``step`` (atomically): a resumed run redoes the steps after its checkpoint."""
    text = "".join(_line(row) for row in read_metrics(path) if row.get("step", 0) <= step)
    atomic_write(path, lambda f: f.write(text.encode()))


def metric_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys that score a model in ``rows`` (the losses first, then the validation metric, ``val_acc`` or a
    user's ``val_metric``, and any other number a row holds, by name): the columns of a table of results."""
    found = {k for row in rows for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return [*LOSSES, *sorted(found - BOOKKEEPING - set(LOSSES))]
