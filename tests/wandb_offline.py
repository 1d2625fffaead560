"""Read back what W&B wrote offline, without a server: the history rows of every offline folder of one run id.

An offline run is ``<WANDB_DIR>/wandb/offline-run-<time>-<id>/run-<id>.wandb``, one folder per ``wandb.init``
(each attempt of a run). The file is a LevelDB-style log: a 7-byte header (``:W&B``, 0xBEE1, version), then
32 KiB blocks of chunks, each with a CRC-32 (over its type byte, then its data), a length and a type (a whole
record, or its first, middle or last part). A record is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_WHOLE, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes() if path.is_file() else b""
    if len(data) < _HEADER.size:  # an attempt that ended inside wandb.init: a folder, no rows
        return
    ident, magic, _version = _HEADER.unpack_from(data, 0)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
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
        if len(body) < size:  # the writer was cut off mid-chunk
            return
        assert zlib.crc32(body, zlib.crc32(bytes([kind]))) == crc, f"{path}: damaged chunk at byte {pos}"
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


def offline_history(wandb_dir: Path, run_id: str) -> list[tuple[str, int, dict[str, Any]]]:
    """(offline folder, step, {key: value}) of every history row of ``run_id`` under ``wandb_dir``, in the order
    the folders were made (their names start with the time)."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for folder in sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}")):
        for raw in _records(folder / f"run-{run_id}.wandb"):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append((folder.name, record.history.step.num, items))
    return rows


def attempts_that_opened_wandb(run_dir: Path) -> list[Path]:
    """Rank 0's logs (one per attempt) that say the attempt's W&B run started: each such attempt has one offline
    folder. An attempt that ends before its W&B run is up (the import alone takes seconds on busy cores) has none,
    and leaves its rows to the next attempt, which sends them from metrics.jsonl."""
    return [log for log in (run_dir / "logs").glob("rank_0*.log") if "logging to W&B run" in log.read_text()]
