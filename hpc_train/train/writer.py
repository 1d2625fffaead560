"""Checkpoints that do not stop training (``trainer.checkpoint_async``).

A synchronous save keeps every rank waiting while rank 0 serialises, hashes, fsyncs and publishes the whole
state. An asynchronous one blocks only while rank 0 copies the state into memory of its own (``Snapshot``:
CPU buffers, pinned when the state is on a GPU, kept from one save to the next so that each save does not
allocate and fault in the state's size again). From a GPU the copies are only queued, on the training stream
after the step that made the state; the background thread waits for them to land, so training does not. A background thread then writes that copy through the same
``Checkpoints.save`` as a synchronous save: temp file named in the ledger, SHA-256, fsync, record, rename last.
So a crash during the background write leaves the previous checkpoint as the newest complete one, exactly as a
crash during a synchronous write does, and the file is the same as a synchronous save's.

- At most one write is in flight: the next save waits for the previous one first (``CheckpointWriter.save``).
- A stop, the end of training and a requeue wait until the write is durable (``CheckpointWriter.wait``; the
  trainer calls it before it reports a stop or saves the final weights).
- An error of the background write (a full disk) is raised in the training thread at the next save or wait.
- The write's disk traffic goes after training's (``background_priority``: the lowest best-effort I/O priority),
  so that a data loader's reads are served first. Its CPU priority stays as it is: measured with 2 ranks on 2
  cores (12 saves of 442 MB, ``benchmarks/checkpoint_async.py --ranks 2``), a thread at nice 19 took 5 s per
  write instead of 2.4 s, so the next save waited for it (0.75 s blocked per save instead of 0.05 s), and the
  run as a whole gained nothing: where training keeps every core busy, the write's CPU work has to come out of
  training either way.

Why a writer of our own rather than torch.distributed.checkpoint's async_save: DCP writes a folder of shards
and a metadata file per checkpoint. The run's ledger (digest and size per file, verified on load), its
``weights_only`` loading, its pruning that never deletes a file it did not write, ``trainer.init_from`` and
every run dir written so far all rest on one file per step; DCP would replace all of them for a DDP state that
is the same on every rank, where spreading the writes over ranks saves nothing that one sequential writer does
not. The blocking part, the copy to CPU, is the same in both.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import platform
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpc_train.train.checkpoint import Checkpoints

__all__ = ["CheckpointWriter", "Saved", "Snapshot", "background_priority"]

log = logging.getLogger(__name__)

_IMMUTABLE = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273}
"""The ioprio_set system call's number (Linux has no libc wrapper for it)."""
_IOPRIO_WHO_PROCESS, _IOPRIO_CLASS_BE, _IOPRIO_LOWEST = 1, 2, 7


def background_priority() -> None:
    """Give the calling thread the lowest best-effort I/O priority, so that training's reads (its data loading)
    go first. Linux keeps it per thread; elsewhere, or where refused, nothing changes. (Best-effort, not the
    idle I/O class: a job that reads its data all the time could starve an idle-class write, and a stop waits
    for the write. The CPU priority is left alone: module docstring.)"""
    thread = threading.get_native_id()
    number = _IOPRIO_SET.get(platform.machine())
    if number is not None and platform.system() == "Linux":
        with suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall(number, _IOPRIO_WHO_PROCESS, thread, (_IOPRIO_CLASS_BE << 13) | _IOPRIO_LOWEST)


class Snapshot:
    """Copies of a state's tensors into buffers of this object's own, reused while the shapes stay the same."""

    def __init__(self, pinned: bool = False) -> None:
        self.pinned = pinned
        """Copy GPU tensors into pinned CPU memory (non-blocking copies, waited for in ``landed``)."""
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._landed: torch.cuda.Event | None = None
        self._device: torch.device | None = None

    def take(self, state: Any) -> Any:
        """A copy of ``state`` that training can no longer change: tensors copied, containers rebuilt, other
        mutable values deep-copied.

        GPU tensors are copied into pinned buffers on the stream that computed them, without waiting: the copies
        run after the kernels already queued (the step that made the state) and before any queued later (the
        next step's updates), so training does not wait for them. Read the buffers after ``landed()``.
        """
        self._next = 0
        self._landed = None
        copied = self._copy(state)
        del self._buffers[self._next :]  # a state that shrank: the buffers it no longer needs go
        if self._landed is not None:
            self._landed.record(torch.cuda.current_stream(self._device))  # after the last copy
        return copied

    def landed(self) -> None:
        """Wait until the copies of the last ``take`` are in host memory (at once for a state on the CPU)."""
        if self._landed is not None:
            self._landed.synchronize()

    def _copy(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach())
        if isinstance(value, dict):
            return {key: self._copy(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._copy(item) for item in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self._copy(item) for item in value)
        if isinstance(value, _IMMUTABLE):
            return value
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        index, self._next = self._next, self._next + 1
        buffer = self._buffers[index] if index < len(self._buffers) else None
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = self.pinned and tensor.device.type == "cuda"
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            if index < len(self._buffers):
                self._buffers[index] = buffer
            else:
                self._buffers.append(buffer)
        pending = buffer.is_pinned() and tensor.device.type == "cuda"
        buffer.copy_(tensor, non_blocking=pending)
        if pending and self._landed is None:
            # blocking: the writer thread sleeps until the copies land instead of spinning on a core
            self._landed, self._device = torch.cuda.Event(blocking=True), tensor.device
        return buffer


@dataclass(frozen=True)
class Saved:
    """A checkpoint that is durable: its step, its file and how long the write took."""

    step: int
    path: Path
    seconds: float


class CheckpointWriter:
    """Rank 0's checkpoint writes, synchronous or in one background thread at a time (module docstring)."""

    def __init__(
        self,
        checkpoints: Checkpoints,
        asynchronous: bool,
        pinned: bool = False,
        on_saved: Callable[[int], None] = lambda step: None,
        on_seconds: Callable[[int, float], None] = lambda step, seconds: None,
    ) -> None:
        self.checkpoints = checkpoints
        self.asynchronous = asynchronous
        self.on_saved = on_saved
        """Told the step of each checkpoint once it is durable (the trainer's observer)..."""
        self.on_seconds = on_seconds
        """...after it is told how long that took."""
        self.snapshot = Snapshot(pinned)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._saved: list[Saved] = []
        self._error: BaseException | None = None

    def save(self, state: Any, step: int, keep: int) -> float:
        """Write the checkpoint of ``step`` (then prune to the newest ``keep``); returns the seconds the caller
        was blocked: the whole write when synchronous, else the wait for the previous write and the copy."""
        started = time.monotonic()
        self.wait()
        if not self.asynchronous:
            path = self.checkpoints.save(state, step, keep)
            with self._lock:
                self._saved.append(Saved(step, path, time.monotonic() - started))
            return time.monotonic() - started
        copied = self.snapshot.take(state)  # GPU tensors: still landing; the thread waits for them
        self._thread = threading.Thread(
            target=self._write, args=(copied, step, keep, time.monotonic()), name="hpc_train-checkpoint-writer"
        )
        self._thread.start()
        return time.monotonic() - started

    def _write(self, state: Any, step: int, keep: int, started: float) -> None:
        background_priority()
        try:
            self.snapshot.landed()
            path = self.checkpoints.save(state, step, keep)
        except BaseException as exc:  # noqa: BLE001 - kept for the training thread, which raises it
            with self._lock:
                self._error = exc
            return
        with self._lock:
            self._saved.append(Saved(step, path, time.monotonic() - started))

    @property
    def writing(self) -> bool:
        """A background write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until no write is in flight; raises the error of one that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def finished(self) -> list[Saved]:
        """The checkpoints that became durable since the last call, oldest first, each logged and told to
        ``on_saved`` (in the caller's thread: the training thread)."""
        with self._lock:
            saved, self._saved = self._saved, []
        for done in saved:
            if self.asynchronous:
                log.info(
                    "checkpoint of step %d durable after %.2f s in the background: %s",
                    done.step,
                    done.seconds,
                    done.path,
                )
            self.on_seconds(done.step, done.seconds)
            self.on_saved(done.step)
        return saved

    def finish_after(self, failure: BaseException) -> None:
        """Training ended on ``failure``: a background write of an earlier, good step still finishes (it is the
        state the next attempt resumes from). An error of its own is logged; ``failure`` is what the caller
        raises."""
        if not self.writing:
            return
        try:
            self.wait()
            self.finished()
        except Exception as error:  # noqa: BLE001 - the failure that ended training is the one to report
            log.error("the checkpoint written in the background failed too: %s (after %s)", error, failure)
