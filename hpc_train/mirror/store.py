"""A second store for a run's results: a path, or any URL fsspec knows (``s3://bucket/prefix`` through s3fs).

Credentials and endpoints come from where the store's own library looks: for S3, the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for Ceph, MinIO or SeaweedFS) or the user's
``~/.aws`` files, and fsspec's ``FSSPEC_S3_*`` variables. Nothing of them is written into the run dir or a log:
the URL is all hpc_train keeps.

Every read and write streams in blocks (a checkpoint of many GB never sits in memory) and hashes what passes, so
that a copy is checked by what the store gives back, not by what was sent.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

__all__ = ["CHUNK", "Store", "describe_error", "is_url"]

CHUNK = 8 * 1024 * 1024
"""Bytes per read and write: S3's multipart uploads take parts of at least 5 MiB."""
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")
S3_CONFIG = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}
"""botocore's settings for an S3 store: an unreachable endpoint fails a copy in tens of seconds, not minutes."""


def is_url(value: str) -> bool:
    return bool(_URL.match(value))


def describe_error(exc: BaseException) -> str:
    """One line for a failed copy: the error's type and its message, whatever the store's library raised."""
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text[:300]}"


class Store:
    """One mirror: ``url`` is a local path or a URL; names are paths in the run dir (``checkpoints/step_9.pt``)."""

    def __init__(self, url: str) -> None:
        # fsspec (and s3fs) only when a mirror is configured
        import fsspec

        self.url = url
        protocol = fsspec.utils.get_protocol(url)
        options: dict[str, Any] = {"config_kwargs": S3_CONFIG} if protocol in ("s3", "s3a") else {}
        self.fs, self.root = fsspec.core.url_to_fs(url, **options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple | list) else (self.fs.protocol,)
        self.local = "file" in protocols or "local" in protocols

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def _parent(self, name: str) -> None:
        if self.local:  # an object store has no folders to make
            self.fs.makedirs(self.path(name).rsplit("/", 1)[0], exist_ok=True)

    def upload(self, source: Path, name: str) -> tuple[str, int]:
        """Copy the file ``source`` to ``name``; the SHA-256 and size of what was read from ``source``."""
        self._parent(name)
        with source.open("rb") as src, self.fs.open(self.path(name), "wb", block_size=CHUNK) as dst:
            return _pump(src, dst.write)

    def write(self, name: str, data: bytes) -> None:
        """``data`` as ``name``, whole or not at all: a local store writes a temp file and renames it; an object
        store's PUT replaces the object at once."""
        self._parent(name)
        if self.local:
            tmp = f"{name}.tmp"
            try:
                self.fs.pipe_file(self.path(tmp), data)
            except BaseException:
                self.discard(tmp)  # a file system that ran full keeps no part of it
                raise
            self.fs.mv(self.path(tmp), self.path(name))
        else:
            self.fs.pipe_file(self.path(name), data)

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name``; None when there is no such file."""
        try:
            data: bytes = self.fs.cat_file(self.path(name))
        except FileNotFoundError:
            return None
        return data

    def digest(self, name: str) -> tuple[str, int]:
        """The SHA-256 and size of ``name`` as the store gives it back."""
        with self.fs.open(self.path(name), "rb", block_size=CHUNK) as src:
            return _pump(src, lambda data: None)

    def download(self, name: str, dest: Path) -> tuple[str, int]:
        """Copy ``name`` into the local file ``dest``, fsynced; the SHA-256 and size of what was read."""

        with self.fs.open(self.path(name), "rb", block_size=CHUNK) as src, dest.open("wb") as out:
            found = _pump(src, out.write)
            out.flush()
            os.fsync(out.fileno())
        return found

    def remove(self, name: str) -> None:
        with suppress(FileNotFoundError):  # gone already
            self.fs.rm_file(self.path(name))

    def discard(self, name: str) -> None:
        """Delete what a failed copy left at ``name``, if the store lets it: the copy's own error is the one to
        report, so this one is not raised."""
        with suppress(Exception):
            self.remove(name)


def _pump(src: IO[bytes], write: Callable[[bytes], Any]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        write(chunk)
    return digest.hexdigest(), size
