"""Checkpoints written in the background (``trainer.checkpoint_async``): the copy training may change no more,
one write in flight, errors raised in the training thread, and the same file as a synchronous save.

Real files and threads; no process group. A SIGKILL during the background write is in tests/runs."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from hpc_train.core.rundir import RunDir
from hpc_train.train.checkpoint import REQUIRED_KEYS, Checkpoints, NoSpaceError, verify_checkpoint
from hpc_train.train.writer import CheckpointWriter, Snapshot


def _state(step: int) -> dict[str, Any]:
    weight = torch.full((256, 256), float(step))
    state: dict[str, Any] = {key: 0 for key in REQUIRED_KEYS}
    state.update(
        model={"w": weight},
        optimizer={"state": {0: {"exp_avg": weight.clone()}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        step=step,
        rng=[(1, [2, 3])],
    )
    return state


def test_the_copy_is_the_state_at_the_save_and_reuses_its_buffers() -> None:
    state = _state(1)
    snapshot = Snapshot()
    copied = snapshot.take(state)
    state["model"]["w"].add_(1)  # training goes on, in place
    state["optimizer"]["param_groups"][0]["lr"] = 0.5
    assert torch.equal(copied["model"]["w"], torch.full((256, 256), 1.0))
    assert copied["optimizer"]["param_groups"][0]["lr"] == 0.1 and copied["rng"] == [(1, [2, 3])]
    again = snapshot.take(state)
    assert again["model"]["w"].data_ptr() == copied["model"]["w"].data_ptr()  # the same buffer, refilled
    assert torch.equal(again["model"]["w"], state["model"]["w"])


def test_a_background_save_is_the_same_file_as_a_synchronous_one(tmp_path: Path) -> None:
    sync_run, async_run = RunDir(tmp_path / "sync"), RunDir(tmp_path / "async")
    CheckpointWriter(Checkpoints(sync_run), asynchronous=False).save(_state(5), 5, keep=2)
    saved: list[int] = []
    writer = CheckpointWriter(Checkpoints(async_run), asynchronous=True, on_saved=saved.append)
    state = _state(5)
    writer.save(state, 5, keep=2)
    state["model"]["w"].add_(100)  # after the copy: not in the file
    writer.wait()
    assert [s.step for s in writer.finished()] == [5] and saved == [5]
    files = [run.checkpoint(5).read_bytes() for run in (sync_run, async_run)]
    assert files[0] == files[1]
    record = Checkpoints(async_run).records()[-1]
    assert verify_checkpoint(async_run.checkpoint(5), record)["step"] == 5


def test_one_write_in_flight_the_next_save_waits_for_it(tmp_path: Path) -> None:
    writing = threading.Event()

    def slow(state: Any, f: IO[bytes]) -> None:
        writing.set()
        time.sleep(0.5)
        torch.save(state, f)

    run = RunDir(tmp_path)
    writer = CheckpointWriter(Checkpoints(run, serialize=slow), asynchronous=True)
    first = writer.save(_state(1), 1, keep=5)
    assert writing.wait(5) and writer.writing and first < 0.4  # training went on while the file is written
    assert not run.checkpoint(1).exists()  # published only once complete
    second = writer.save(_state(2), 2, keep=5)
    assert second >= 0.3, "the second save must wait for the first write"
    assert run.checkpoint(1).is_file()
    writer.wait()
    assert [r.step for r in Checkpoints(run).records()] == [1, 2]


def test_an_error_of_the_background_write_is_raised_in_the_training_thread(tmp_path: Path) -> None:
    def full(state: Any, f: IO[bytes]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    run = RunDir(tmp_path)
    writer = CheckpointWriter(Checkpoints(run, serialize=full), asynchronous=True)
    writer.save(_state(1), 1, keep=2)
    with pytest.raises(NoSpaceError, match="no space left on device while writing"):
        writer.wait()
    writer.wait()  # raised once
    assert not list(run.checkpoints.glob("*.tmp")) and Checkpoints(run).records() == []
