"""Rank 0's copies of a run to its mirror (``trainer.mirror``), in the background, and the way back.

``Mirror.sync()`` asks for a copy of what is new and returns at once: training never waits for the store. One
thread copies, one sync at a time; a request that comes while one is in flight is served once it ends, so at
most one copy is in flight and a burst of checkpoints costs one copy of the newest. A sync:

1. copies the newest checkpoint the run dir's ledger names, unless the mirror holds it already. The bytes are
   hashed as they are read from the run dir (a file that no longer matches its ledger is not copied), then read
   back from the store and hashed again; only a copy whose SHA-256 and size are the ledger's is named in the
   mirror's own ledger (``mirror.json`` at its root, a ``MirrorLedger``);
2. copies ``model_final.pt`` and the small files that tell the run's story (config.yaml, overrides.json,
   metrics.jsonl and the status ledgers) when they changed, each read back and checked the same way;
3. prunes the mirror to the newest ``keep`` checkpoints, deleting only files its ledger names.

A failure (the store unreachable or full, a copy cut off, a read-back that differs) is one warning that names
the store and the error; nothing is named for it, and the next sync tries again. ``status/mirror.json`` says
what landed last (``MirrorStatus``). ``wait`` bounds how long a stop waits for the copy in flight.

``restore_newest`` is the way back: the newest checkpoint the mirror names, downloaded into the run dir and
checked against the mirror's ledger, an older one when it does not match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_train.core.errors import HpcTrainError
from hpc_train.core.files import file_digest
from hpc_train.core.records import MirroredFile, MirrorLedger, MirrorStatus
from hpc_train.core.rundir import RunDir
from hpc_train.mirror.store import Store, describe_error

__all__ = [
    "LEDGER",
    "STORY",
    "Mirror",
    "MirrorError",
    "MirrorUnreadable",
    "holds_this_run",
    "other_run",
    "read_ledger",
    "restore_newest",
]

log = logging.getLogger("hpc_train")

LEDGER = "mirror.json"
"""The mirror's own ledger, at its root."""
STORY = (
    "config.yaml",
    "overrides.json",
    "job.json",
    "metrics.jsonl",
    "status/attempts.json",
    "status/restarts.json",
    "status/allocations.json",
    "status/goodput.json",
    "status/trackers.json",
    "status/bad_nodes.json",
    "status/reshapes.json",
    "status/growths.json",
)
"""The small files that tell the run's story, copied at each sync when they changed."""


class MirrorError(RuntimeError):
    """A copy that did not land whole (the store gave back other bytes than were sent)."""


class MirrorUnreadable(HpcTrainError, RuntimeError):
    """A run that trained before has no checkpoint in its run dir, and its mirror cannot be read: it must not start
    over (that would replace the mirror's copies of it)."""


def read_ledger(store: Store) -> MirrorLedger | None:
    """The mirror's ledger; None when it has none. A damaged one keeps what is whole of it."""
    data = store.read(LEDGER)
    if data is None:
        return None
    try:
        raw = json.loads(data)
    except ValueError:
        log.warning("hpc_train: the ledger of mirror %s is not JSON: its files are not used", store.url)
        return None
    ledger, problems = MirrorLedger.salvage(raw)
    if not problems:
        return ledger
    # Entry by entry: one damaged entry must not unname the files the others name (the way back needs them).
    record: dict[str, Any] = raw if isinstance(raw, dict) else {}
    entries = record.get("files")
    whole = tuple(f for f in (MirroredFile.salvage(e)[0] for e in entries or [] if isinstance(entries, list)) if f)
    run = str(record.get("run") or "")
    log.warning(
        "hpc_train: the ledger of mirror %s is damaged (%s): the %d whole entries of it are used",
        store.url,
        "; ".join(problems)[:300],
        len(whole),
    )
    return MirrorLedger(run=run, files=whole)


class Mirror:
    """Rank 0's mirror of one run dir (module docstring). ``checkpoints``: the run dir's checkpoint ledger as the
    files the mirror should hold (``name`` under ``checkpoints/``, the ledger's step, SHA-256 and size), oldest
    first; ``keep``: how many checkpoints the mirror keeps."""

    def __init__(
        self,
        run_dir: RunDir,
        url: str,
        keep: int,
        checkpoints: Callable[[], Sequence[MirroredFile]],
        store: Callable[[str], Store] = Store,
        hook: Callable[[Path], object] | None = None,
        hook_name: str = "",
        outputs: Callable[[], Sequence[str]] = lambda: (),
    ) -> None:
        self.run_dir, self.url, self.keep = run_dir, url, max(keep, 1)
        self._checkpoints, self._open_store = checkpoints, store
        self._hook, self._hook_name = hook, hook_name
        self._outputs = outputs
        """Other files of the run dir to copy when they changed (a user's script's own outputs), by path in it."""
        self.where = url or f"trainer.mirror_hook={hook_name}"
        """The store in words: its URL, or the user's function."""
        self._hooked: dict[str, str] = {}
        """The SHA-256 of each file the hook took (a file is given to it again only once it changed)."""
        self._store: Store | None = None
        self._cond = threading.Condition()
        self._wanted = False
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.error = ""
        """The latest sync's error ('' after one that landed)."""
        self.synced = 0
        """Syncs finished (landed or not)."""

    # ---- the training thread ----------------------------------------------------------------------------------

    def sync(self) -> None:
        """Copy what is new, in the background (starts the thread the first time)."""
        with self._cond:
            if self._closing:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="hpc_train-mirror", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Until no sync is in flight or wanted, ``timeout`` at most; whether it got there."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._wanted or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float, why: str) -> bool:
        """A last sync (the stop's checkpoint, the final weights), waited for ``timeout`` at most; says in the log
        whether it landed. ``why``: the stop, in words. The thread is left behind if it is still copying: it
        is a daemon, and the process's end cuts the copy off (never named)."""
        started = time.monotonic()
        self.sync()
        landed = self.wait(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        newest = self.newest()
        holds = f"it holds step {newest.step}" if newest is not None else "it holds no checkpoint"
        if not landed:
            log.warning(
                "hpc_train: mirror %s: the copy after %s did not land within %.0f s (trainer.mirror_wait_s); %s",
                self.where,
                why,
                timeout,
                holds,
            )
        elif self.error:
            log.warning("hpc_train: mirror %s: the copy after %s failed (%s); %s", self.where, why, self.error, holds)
        else:
            log.info(
                "hpc_train: mirror %s: the copy after %s landed, verified, %.1f s later; %s",
                self.where,
                why,
                time.monotonic() - started,
                holds,
            )
        return landed and not self.error

    def newest(self) -> MirroredFile | None:
        """The newest checkpoint the mirror's ledger names, as this process last wrote or read it."""
        ledger = self._ledger
        checkpoints = ledger.checkpoints() if ledger is not None else []
        return checkpoints[-1] if checkpoints else None

    # ---- the mirror's thread ----------------------------------------------------------------------------------

    _ledger: MirrorLedger | None = None

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._closing:
                    self._cond.wait()
                if not self._wanted:
                    return
                self._wanted, self._busy = False, True
            started = time.monotonic()
            try:
                self._sync_once()
                error = ""
            except Exception as exc:  # noqa: BLE001 - whatever the store raised: a warning, and the next sync
                error = describe_error(exc)
                log.warning("hpc_train: mirror %s: the copy failed, the next one tries again: %s", self.where, error)
            self._record(error, time.monotonic() - started)
            with self._cond:
                self.error, self._busy = error, False
                self.synced += 1
                self._cond.notify_all()

    def _sync_once(self) -> None:
        if not self.url:  # trainer.mirror_hook alone: the user's function is the store
            self._hook_files(self._verified_here())
            return
        if self._store is None:
            self._store = self._open_store(self.url)
        store = self._store
        ours = str(self.run_dir.path.resolve())
        ledger = read_ledger(store) or MirrorLedger(run=ours)
        if not holds_this_run(ledger, self.run_dir, self.url):
            raise MirrorError(other_run(ledger, self.run_dir, self.url))
        ledger = replace(ledger, run=ours)  # (a run pulled from it to another place goes on there)
        self._ledger = ledger
        checkpoints = list(self._checkpoints())
        if checkpoints:
            newest = checkpoints[-1]
            held = ledger.named(newest.name)
            if held is None or held.sha256 != newest.sha256:
                ledger = self._land(store, ledger, self.run_dir.path / newest.name, newest)
        final = self.run_dir.model_final
        if final.is_file():
            sha, size = file_digest(final)
            held = ledger.named(final.name)
            if held is None or held.sha256 != sha:
                expected = MirroredFile(name=final.name, sha256=sha, size=size, time=time.time())
                ledger = self._land(store, ledger, final, expected)
        ledger = self._story(store, ledger)
        for name in self._outputs():
            path = self.run_dir.path / name
            if not path.is_file():
                continue
            sha, size = file_digest(path)
            held = ledger.named(name)
            if held is None or held.sha256 != sha:
                ledger = self._land(
                    store, ledger, path, MirroredFile(name=name, sha256=sha, size=size, time=time.time())
                )
        self._ledger = self._prune(store, ledger)
        self._hook_files(self._ledger.files)

    def _verified_here(self) -> list[MirroredFile]:
        """Without a store: the newest checkpoint when its file still matches its ledger, the final weights and
        the story files, as they are now."""
        found = []
        checkpoints = list(self._checkpoints())
        if checkpoints:
            newest = checkpoints[-1]
            path = self.run_dir.path / newest.name
            if path.is_file() and file_digest(path) == (newest.sha256, newest.size):
                found.append(newest)
            elif path.is_file():
                raise MirrorError(f"{path} no longer matches its ledger: not given to {self._hook_name}")
        for name in (self.run_dir.model_final.name, *STORY):
            path = self.run_dir.path / name
            if path.is_file():
                sha, size = file_digest(path)
                found.append(MirroredFile(name=name, sha256=sha, size=size, time=time.time()))
        return found

    def _hook_files(self, files: Sequence[MirroredFile]) -> None:
        """trainer.mirror_hook with each verified file it has not taken yet as it is; a failure is a warning,
        and the file is offered again at the next sync."""
        if self._hook is None:
            return
        for entry in files:
            path = self.run_dir.path / entry.name
            if self._hooked.get(entry.name) == entry.sha256 or not path.is_file():
                continue
            try:
                self._hook(path)
            except Exception as exc:  # noqa: BLE001 - the user's function: a warning, and the next sync
                log.warning(
                    "hpc_train: trainer.mirror_hook=%s failed on %s: %s", self._hook_name, path, describe_error(exc)
                )
                continue
            self._hooked[entry.name] = entry.sha256

    def _land(self, store: Store, ledger: MirrorLedger, source: Path, expected: MirroredFile) -> MirrorLedger:
        """Copy ``source``, read it back, and name it in the ledger when both match ``expected``. A file the
        ledger names under that name is unnamed first: the ledger never names bytes that are being replaced."""
        if ledger.named(expected.name) is not None:
            ledger = self._write(
                store, replace(ledger, files=tuple(f for f in ledger.files if f.name != expected.name))
            )
        try:
            self._copy(store, source, expected)
        except BaseException:
            # A partial or mismatched copy is never named; it is deleted too, so that a store that ran full, or a
            # copy cut off, does not keep the space it took (the name was unnamed above: nothing else is there).
            store.discard(expected.name)
            raise
        return self._name(store, ledger, replace(expected, time=time.time()))

    @staticmethod
    def _copy(store: Store, source: Path, expected: MirroredFile) -> None:
        """Copy ``source`` to ``expected.name`` and read it back; MirrorError when either differs from ``expected``."""
        sent = store.upload(source, expected.name)
        if sent != (expected.sha256, expected.size):
            raise MirrorError(
                f"{source} no longer matches its ledger, or changed while it was copied ({sent[1]} bytes, SHA-256 "
                f"{sent[0][:12]}...; expected {expected.size} bytes, {expected.sha256[:12]}...): not mirrored"
            )
        back = store.digest(expected.name)
        if back != sent:
            raise MirrorError(
                f"{store.path(expected.name)} reads back as {back[1]} bytes with SHA-256 {back[0][:12]}..., not the "
                f"{sent[1]} bytes sent ({sent[0][:12]}...): not named in the mirror's ledger"
            )

    def _story(self, store: Store, ledger: MirrorLedger) -> MirrorLedger:
        """The small files that changed since the mirror last held them: unnamed, written, read back, named (two
        writes of the ledger for all of them)."""
        changed = []
        for name in STORY:
            try:
                data = (self.run_dir.path / name).read_bytes()
            except FileNotFoundError:
                continue
            sha = hashlib.sha256(data).hexdigest()
            held = ledger.named(name)
            if held is None or held.sha256 != sha:
                changed.append((name, data, sha))
        if not changed:
            return ledger
        names = {name for name, _, _ in changed}
        if any(ledger.named(name) is not None for name in names):
            ledger = self._write(store, replace(ledger, files=tuple(f for f in ledger.files if f.name not in names)))
        landed = []
        for name, data, sha in changed:
            store.write(name, data)
            if store.digest(name) != (sha, len(data)):
                raise MirrorError(f"{store.path(name)} reads back other bytes than were sent: not named")
            landed.append(MirroredFile(name=name, sha256=sha, size=len(data), time=time.time()))
        return self._write(store, replace(ledger, files=(*ledger.files, *landed)))

    def _name(self, store: Store, ledger: MirrorLedger, landed: MirroredFile) -> MirrorLedger:
        return self._write(store, replace(ledger, files=(*(f for f in ledger.files if f.name != landed.name), landed)))

    def _write(self, store: Store, ledger: MirrorLedger) -> MirrorLedger:
        ledger = replace(ledger, time=time.time())
        store.write(LEDGER, json.dumps(ledger.to_json(), indent=1).encode())
        self._ledger = ledger
        return ledger

    def _prune(self, store: Store, ledger: MirrorLedger) -> MirrorLedger:
        """The mirror's checkpoints but the newest ``keep``: unnamed first (so a ledger never names a file that is
        gone), then deleted."""
        old = ledger.checkpoints()[: -self.keep]
        if not old:
            return ledger
        gone = {f.name for f in old}
        ledger = self._write(store, replace(ledger, files=tuple(f for f in ledger.files if f.name not in gone)))
        for name in sorted(gone):
            store.remove(name)
        return ledger

    def _record(self, error: str, seconds: float) -> None:
        newest = self.newest()
        status = MirrorStatus(
            store=self.where,
            time=time.time(),
            landed=newest.name if newest is not None else "",
            landed_step=newest.step if newest is not None else None,
            error=error,
            seconds=round(seconds, 3),
        )
        try:
            self.run_dir.write_mirror_status(status)
        except OSError as exc:  # the run dir's file system: the log has the copy's outcome
            log.warning("hpc_train: could not record the mirror's state in %s: %s", self.run_dir.status_dir, exc)


def holds_this_run(ledger: MirrorLedger, run_dir: RunDir, url: str) -> bool:
    """Whether the mirror's ledger is this run's: written from this run dir, or from the one it was pulled from
    (``jobs pull`` leaves ``status/pulled.json``). A mirror holds one run: another run's files are never resumed
    from, overwritten or pruned."""
    if not ledger.files or ledger.run == str(run_dir.path.resolve()):
        return True
    pulled = run_dir.pulled_from()
    return pulled is not None and pulled.store == url and pulled.run == ledger.run


def other_run(ledger: MirrorLedger, run_dir: RunDir, url: str) -> str:
    return (
        f"{url} holds the run of {ledger.run}, not {run_dir.path}: nothing is copied there nor resumed from it. "
        "HINT: give each run a mirror of its own (e.g. trainer.mirror=s3://bucket/runs/<name of the run>), or "
        f"bring that run here with python -m hpc_train.jobs pull {url} RUN_DIR"
    )


def restore_newest(store: Store, checkpoints: Path, ledger: MirrorLedger | None = None) -> MirroredFile | None:
    """The newest checkpoint the mirror names, downloaded into the folder ``checkpoints`` and checked against the
    mirror's ledger (a download that differs is deleted, with a warning, and the next older one is tried);
    None when the mirror holds none that is whole."""
    ledger = ledger or read_ledger(store)
    for record in reversed(ledger.checkpoints() if ledger is not None else []):
        dest = checkpoints / Path(record.name).name
        tmp = dest.with_name(f".{dest.name}.mirror")
        checkpoints.mkdir(parents=True, exist_ok=True)
        try:
            got = store.download(record.name, tmp)
        except Exception as exc:  # noqa: BLE001 - gone or unreadable in the store: the next older one
            tmp.unlink(missing_ok=True)
            log.warning("hpc_train: mirror %s: %s could not be read: %s", store.url, record.name, describe_error(exc))
            continue
        if got != (record.sha256, record.size):
            tmp.unlink(missing_ok=True)
            log.warning(
                "hpc_train: mirror %s: %s is damaged (%d bytes, SHA-256 %s...; its ledger says %d bytes, %s...): "
                "the next older one is tried",
                store.url,
                record.name,
                got[1],
                got[0][:12],
                record.size,
                record.sha256[:12],
            )
            continue
        if dest.exists() or dest.is_symlink():  # a file the run's ledger does not name: kept, never overwritten
            os.replace(dest, dest.with_name(f"{dest.name}.before-mirror"))
        os.replace(tmp, dest)
        return record
    return None
