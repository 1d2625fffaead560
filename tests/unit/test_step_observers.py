"""The trainer's observers (train/hooks.py, runtime/observers.py), the metrics window and the step tag."""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO, Any

import pytest
import torch
import torch.distributed as dist

from hpc_train.core.errors import failed_step, tag_step
from hpc_train.core.rundir import RunDir
from hpc_train.runtime import observers
from hpc_train.runtime.faults import Fault, FaultObserver
from hpc_train.runtime.observers import Heartbeat, Kicks, ProgressFile
from hpc_train.train.hooks import FitResult, Observers, StepObserver
from hpc_train.train.window import MetricsWindow


class Recorder(StepObserver):
    def __init__(self, name: str, calls: list[tuple[str, str, Any]]) -> None:
        self.name, self.calls = name, calls

    def on_step(self, step: int) -> None:
        self.calls.append((self.name, "step", step))

    def on_phase(self, name: str) -> None:
        self.calls.append((self.name, "phase", name))

    def checkpoint_writer(self, serialize: Any) -> Any:
        def write(state: Any, f: IO[bytes]) -> None:
            self.calls.append((self.name, "write", state))
            serialize(state, f)

        return write


def test_observers_fan_out_in_order_and_chain_the_checkpoint_writer() -> None:
    calls: list[tuple[str, str, Any]] = []
    both = Observers(Recorder("a", calls), StepObserver(), Recorder("b", calls))
    both.on_step(3)
    both.on_phase("validating")
    both.on_row(3, {})
    both.on_saved(3)
    written: list[Any] = []
    both.checkpoint_writer(lambda state, f: written.append(state))("state", io.BytesIO())
    assert calls == [
        ("a", "step", 3),
        ("b", "step", 3),
        ("a", "phase", "validating"),
        ("b", "phase", "validating"),
        ("b", "write", "state"),  # the last observer's writer wraps the others'
        ("a", "write", "state"),
    ]
    assert written == ["state"]


def test_the_default_observer_does_nothing_and_keeps_the_writer() -> None:
    quiet = StepObserver()
    quiet.on_start(0)
    quiet.on_step(1)
    quiet.on_phase("checkpointing")
    quiet.on_row(1, {})
    quiet.on_saved(1)
    assert quiet.checkpoint_writer(torch.save) is torch.save


def test_progress_file_writes_the_first_step_at_once_then_every_interval_and_after_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rd = RunDir(tmp_path)
    progress = ProgressFile(rd, 0)
    progress.on_start(10)
    progress.on_step(11)
    first = rd.progress_record(0)
    assert (first.first_step, first.step, first.checkpoint_step) == (11, 11, None) and first.first_time
    progress.on_step(12)  # within PROGRESS_EVERY_S: not written
    assert rd.progress_record(0).step == 11
    monkeypatch.setattr(observers, "PROGRESS_EVERY_S", 0.0)
    progress.on_step(13)
    assert rd.progress_record(0).step == 13
    monkeypatch.setattr(observers, "PROGRESS_EVERY_S", 3600.0)
    progress.on_saved(13)
    saved = rd.progress_record(0)
    assert (saved.step, saved.checkpoint_step, saved.first_time) == (13, 13, first.first_time)


def test_a_run_resumed_at_its_end_records_no_step_but_its_final_weights(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    progress = ProgressFile(rd, 0)
    progress.on_start(40)
    progress.on_saved(40)
    record = rd.progress_record(0)
    assert (record.first_step, record.first_time, record.step, record.checkpoint_step) == (41, 0.0, 40, 40)


def test_heartbeat_and_kicks(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    Heartbeat(rd, 1).on_row(7, {"cuda_max_mem_mb": 12.5})
    status = rd.rank_statuses()[1]
    assert (status.state.value, status.step, status.extra) == ("running", 7, {"cuda_max_mem_mb": 12.5})

    class Dog:
        def __init__(self) -> None:
            self.kicks: list[str] = []

        def kick(self, what: str = "training") -> None:
            self.kicks.append(what)

    dog = Dog()
    kicks = Kicks(dog)  # type: ignore[arg-type]
    kicks.on_step(1)
    kicks.on_phase("checkpointing")
    assert dog.kicks == ["training", "checkpointing"]


def test_fault_observer_fires_on_its_rank_and_step() -> None:
    FaultObserver(Fault(rank=1, step=3, kind="raise"), rank=0).on_step(3)
    with pytest.raises(RuntimeError, match="injected fault"):
        FaultObserver(Fault(rank=1, step=3, kind="raise"), rank=1).on_step(3)
    assert FaultObserver(Fault(rank=0, step=3, kind="raise"), rank=0).checkpoint_writer(torch.save) is torch.save


def test_metrics_window_rows() -> None:
    window = MetricsWindow(torch.device("cpu"), global_batch=8, lr=0.1)
    window.start()
    window.add(torch.tensor(2.0), 0.1)
    window.stepped()
    window.add(torch.tensor(4.0), 0.05)
    window.stepped()
    first_at = window.first_step_at
    assert first_at > 0
    with _one_rank():
        row = window.close(step=2, epoch=0)
        assert (row["step"], row["epoch"], row["train_loss"], row["lr"], row["first_step_at"]) == (
            2,
            0,
            3.0,
            0.05,
            first_at,
        )
        assert row["samples_per_s"] > 0 and row["time_s"] >= 0
        window.restore(torch.tensor(6.0), 2, 0.01)
        second = window.close(step=4, epoch=1)
    assert (second["train_loss"], second["lr"]) == (3.0, 0.01) and "first_step_at" not in second
    assert (window.steps, float(window.loss)) == (0, 0.0)


def test_the_step_tag_belongs_to_its_exception_and_leaves_it_as_it_was() -> None:
    error, other = RuntimeError("boom"), RuntimeError("boom")
    tag_step(error, 12)
    assert (failed_step(error), failed_step(other)) == (12, None)
    assert (type(error), str(error), getattr(error, "__notes__", None)) == (RuntimeError, "boom", None)


def test_write_failure_records_the_tagged_step(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    error = ValueError("bad")
    tag_step(error, 5)
    rd.write_failure(0, error)
    assert rd.rank_statuses()[0].failed_step == 5


def test_fit_result_is_keyword_only_and_frozen() -> None:
    result = FitResult(completed=True, start_step=0, step=4, signal=0)
    with pytest.raises(TypeError):
        FitResult(True, 0, 4, 0)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        result.step = 5  # type: ignore[misc]
    assert result.peak == {}


class _one_rank:
    """A one-rank gloo process group, for the window's all_reduce."""

    def __enter__(self) -> None:
        self.mine = not dist.is_initialized()
        if self.mine:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        if self.mine:
            dist.destroy_process_group()


def test_a_trainer_is_built_without_touching_the_run_dir_and_never_fits_without_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Construction only constructs (no metrics file, no checkpoint folder); a resume that failed is tried again
    by ``fit``, which so never trains past a checkpoint it did not load."""
    from hpc_train.train.trainer import Trainer

    from .test_config import composed
    from .test_process_group import env_with

    cfg = composed("cluster.tasks_per_node=1", "data.num_samples=256", "trainer.max_steps=2", "trainer.plots=false")
    rd = RunDir(tmp_path)
    with _one_rank():
        trainer = Trainer(cfg, env_with(0, 1), torch.device("cpu"), rd)
        assert sorted(p.name for p in tmp_path.iterdir()) == []
        calls: list[int] = []

        def broken() -> None:
            calls.append(1)
            raise OSError("the file system went away")

        monkeypatch.setattr(trainer, "_resume", broken)
        with pytest.raises(OSError):
            trainer.resume()
        with pytest.raises(OSError):
            trainer.fit()
        assert len(calls) == 2 and trainer.step == 0 and not rd.metrics.exists()
        trainer.close()
