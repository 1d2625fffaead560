"""What W&B wrote offline, read back without a server: the latest history step of a run's offline folders.

An offline W&B run is ``<dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb``, one folder per ``wandb.init`` (each
attempt of a run), and that folder is the store until ``wandb sync`` uploads it. The file is a LevelDB-style log:
a 7-byte header (``:W&B``, 0xBEE1, a version), then 32 KiB blocks of chunks, each a CRC-32 (over its type byte,
then its data), a length, a type (a whole record, or its first, middle or last part) and the data. A record is a
``wandb_internal_pb2.Record`` protobuf (W&B's own package, there whenever W&B is used).

A rank that was killed, or whose ``finish`` did not return within the end of its attempt, leaves rows here that
the run dir's ``logged_step`` does not count; the next attempt reads them (``TrackerLog``) rather than send them
twice. Reading stops at the first chunk that is cut off or damaged (the writer was killed there): what comes
before it is what the store holds.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["offline_folders", "offline_records", "offline_step"]

_BLOCK = 32 * 1024
_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_WHOLE, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
MAGIC = (b":W&B", 0xBEE1)


def offline_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of ``run_id`` under ``wandb_dir`` (W&B's ``dir``), oldest first (names start with the
    time)."""
    return sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def offline_records(path: Path) -> Iterator[bytes]:
    """The whole records of one run file, in order, up to the first cut-off or damaged chunk. A file that is not
    W&B's raises ValueError."""
    data = path.read_bytes() if path.is_file() else b""
    if len(data) < _HEADER.size:  # an attempt that ended inside wandb.init: a folder, no rows
        return
    ident, magic, _version = _HEADER.unpack_from(data, 0)
    if (ident, magic) != MAGIC:
        raise ValueError(f"{path} is not a W&B run file (header {ident!r}, {magic:#x})")
    pos, parts = _HEADER.size, b""
    while pos + _CHUNK.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        crc, size, kind = _CHUNK.unpack_from(data, pos)
        if size == 0 and kind == 0:  # zero padding to the end of the block
            pos += room
            continue
        body = data[pos + _CHUNK.size : pos + _CHUNK.size + size]
        if len(body) < size or zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            return  # the writer was cut off here
        pos += _CHUNK.size + size
        if kind == _WHOLE:
            yield body
        elif kind == _FIRST:
            parts = body
        elif kind == _MIDDLE:
            parts += body
        elif kind == _LAST:
            yield parts + body
            parts = b""


def offline_step(wandb_dir: Path, run_id: str) -> int | None:
    """The latest history step that the offline folders of ``run_id`` hold, or None (no folder, no row)."""
    # wandb (an optional extra) only to read a run's offline files
    from wandb.proto import wandb_internal_pb2

    latest: int | None = None
    for folder in offline_folders(wandb_dir, run_id):
        for raw in offline_records(folder / f"run-{run_id}.wandb"):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                step = record.history.step.num
                latest = step if latest is None else max(latest, step)
    return latest
