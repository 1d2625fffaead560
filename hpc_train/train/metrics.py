"""metrics.jsonl: one JSON object per log or validation step, appended and flushed by rank 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

__all__ = ["MetricsWriter", "read_metrics"]


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
    """All rows of a metrics.jsonl file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
