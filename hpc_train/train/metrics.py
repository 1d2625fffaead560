"""metrics.jsonl: one JSON object per log or validation step, appended and flushed by rank 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

__all__ = ["MetricsWriter", "last_metrics", "read_metrics"]


class MetricsWriter:
    """Appends rows to a JSONL file; a no-op on ranks other than 0."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self._file: IO[str] | None = path.open("a") if enabled else None

    def write(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(row, sort_keys=True) + "\n")
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
