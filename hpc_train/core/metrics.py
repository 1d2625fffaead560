"""metrics.jsonl: one JSON object per log or validation step, appended and flushed by rank 0."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write

__all__ = ["MetricsWriter", "drop_rows_after", "last_metrics", "metric_keys", "read_metrics"]

LOSSES = ("train_loss", "val_loss")
"""The columns every table of results starts with."""
log = logging.getLogger(__name__)
BOOKKEEPING = frozenset(
    {"step", "epoch", "lr", "samples_per_s", "time_s", "first_step_at", "cuda_max_mem_mb", "val_samples"}
)
"""Keys of a row that describe the training rather than score the model."""


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def _refuse_link(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} is a symbolic link (to {os.readlink(path)}): rank 0 writes the run's metrics into the run dir's own "
        "metrics.jsonl and does not follow a link, which would write them into whatever file it names. HINT: "
        f"remove the link (rm {path}), or put a copy of the file it names in its place, then start the run again."
    )


class MetricsWriter:
    """Appends rows to a JSONL file; a no-op on ranks other than 0. A symbolic link at ``path`` is refused
    (ConfigError) rather than followed: the rows are the run's, not those of a file the link names."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self._file: IO[str] | None = None
        if enabled:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(path, flags, 0o666)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (a dangling one too)
                    raise _refuse_link(path) from None
                raise
            self._file = os.fdopen(fd, "a")

    def write(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(_line(row))
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _parse(line: bytes) -> dict[str, Any] | None:
    """The row a line holds; None when it is no JSON object, or its ``step`` is no number."""
    try:
        row = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(row, dict):
        return None
    step = row.get("step", 0)
    return row if isinstance(step, int | float) and not isinstance(step, bool) and math.isfinite(step) else None


def _lines(path: Path) -> tuple[list[tuple[bytes, dict[str, Any] | None]], bytes]:
    """Each line of the file with its row (None for a bad one), less blank lines; and apart, a last line still
    being written (one without its newline that is no row yet), b"" when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], b""
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with its newline
    parsed = [(line, _parse(line)) for line in lines if line.strip()]
    row = _parse(last) if last.strip() else None
    if row is not None:  # complete but for its newline (written by hand?): a row all the same
        parsed.append((last, row))
    return parsed, (last if last.strip() and row is None else b"")


_warned: dict[Path, int] = {}
"""How many bad rows each file had when that was last logged: a file is re-read often (plots, followers),
and its damage is worth one warning, and one more only when it changes."""


def _warn_bad_rows(path: Path, parsed: list[tuple[bytes, dict[str, Any] | None]]) -> None:
    bad = [line for line, row in parsed if row is None]
    if bad and _warned.get(path) != len(bad):
        _warned[path] = len(bad)
        log.warning(
            "%s: skipped %d bad row(s), not a JSON object with a numeric step (the first: %r). HINT: the file is "
            "rank 0's own record of the run; find what else wrote into it.",
            path,
            len(bad),
            bad[0][:120],
        )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics.jsonl file (none if it does not exist yet).

    Rank 0 appends while others read, so a last line still being written is skipped, not an error. A line that
    is no row (garbage, a JSON value other than an object, a ``step`` that is no number) is skipped too, with
    one warning that names the file and how many there are.
    """
    parsed, _ = _lines(path)
    _warn_bad_rows(path, parsed)
    return [row for _, row in parsed if row is not None]


def last_metrics(path: Path) -> dict[str, Any]:
    """The latest value of every metric (validation rows and train rows come at different steps)."""
    merged: dict[str, Any] = {}
    for row in read_metrics(path):
        merged.update(row)
    return merged


def drop_rows_after(path: Path, step: int) -> None:
    """Keep only the rows up to ``step`` (atomically): a resumed run redoes the steps after its checkpoint.

    Bad lines (see ``read_metrics``) are kept as they are, where they are: the step they belong to is unknown,
    and what the run dir held is not deleted behind its owner's back (readers go on skipping them, with their
    warning). A last line without its newline is dropped: a row torn when the rank writing it died, of the
    newest step written, which the resumed run writes again. A symbolic link at ``path`` is refused, as
    ``MetricsWriter`` refuses it.
    """
    if path.is_symlink():
        raise _refuse_link(path)
    parsed, torn = _lines(path)
    _warn_bad_rows(path, parsed)
    if torn:
        log.warning("%s: dropped a torn last row (the rank writing it died): %r", path, torn[:120])
    kept = [line for line, row in parsed if row is None or row.get("step", 0) <= step]
    atomic_write(path, lambda f: f.write(b"".join(line + b"\n" for line in kept)))


def metric_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys that score a model in ``rows`` (the losses first, then the validation metric, ``val_acc`` or a
    user's ``val_metric``, and any other number a row holds, by name): the columns of a table of results."""
    found = {k for row in rows for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return [*LOSSES, *sorted(found - BOOKKEEPING - set(LOSSES))]
