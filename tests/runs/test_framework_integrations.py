"""The framework integrations against the real frameworks, each in a child interpreter that imports transformers
or Lightning (seconds each, so not among the unit tests): resume helpers that skip a save in progress, and the
checks that every rank trains one model.

Importing an integration installs hpc_train's stop-signal handlers in that process, so each check runs in a
child interpreter rather than in pytest's own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..unit.test_integrations import python

pytestmark = pytest.mark.slow


def test_transformers_last_checkpoint_skips_a_half_written_one(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="from the test extra: pip install -e '.[test]'")
    for step, files in {10: ["trainer_state.json"], 20: ["trainer_state.json", "hpc_train_complete"], 30: []}.items():
        (tmp_path / "a" / f"checkpoint-{step}").mkdir(parents=True)
        for name in files:
            (tmp_path / "a" / f"checkpoint-{step}" / name).touch()
    (tmp_path / "b" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "b" / "checkpoint-3" / "trainer_state.json").touch()  # a run without the callback
    (tmp_path / "b" / "checkpoint-4").mkdir()
    proc = python(f"""
        from hpc_train.integrations.transformers import last_checkpoint
        print(last_checkpoint({str(tmp_path / "a")!r}), last_checkpoint({str(tmp_path / "b")!r}),
              last_checkpoint({str(tmp_path / "c")!r}))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "a" / "checkpoint-20"), str(tmp_path / "b" / "checkpoint-3"), "None"]


def test_lightning_last_checkpoint_ignores_a_save_in_progress(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    for name in ("hpc_ckpt_9.ckpt", "hpc_ckpt_12.ckpt", ".hpc_train_saving_15", "epoch=3.ckpt"):
        (tmp_path / name).touch()
    proc = python(f"""
        from hpc_train.integrations.lightning import last_checkpoint
        print(last_checkpoint({str(tmp_path)!r}))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "hpc_ckpt_12.ckpt")


def test_transformers_warns_once_when_the_ranks_train_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU without use_cpu=True the Trainer is not distributed although hpc_train started several ranks."""
    pytest.importorskip("transformers", reason="from the test extra: pip install -e '.[test]'")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("LOCAL_RANK", "RANK", "ACCELERATE_USE_CPU"):  # else accelerate would start a process group
        monkeypatch.delenv(name, raising=False)
    proc = python("""
        import types, warnings
        from transformers import TrainerControl, TrainerState, TrainingArguments
        from hpc_train.integrations.transformers import PreemptionCallback

        alone = TrainingArguments(output_dir="unused", report_to="none")  # as a CPU script without use_cpu=True
        together = types.SimpleNamespace(world_size=2)  # a distributed Trainer on 2 ranks
        state, control = TrainerState(), TrainerControl()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            PreemptionCallback().on_train_begin(together, state, control)
            callback = PreemptionCallback()
            callback.on_train_begin(alone, state, control)
            callback.on_train_begin(alone, state, control)
        for w in caught:
            print("WARNING", w.category.__name__, str(w.message))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1, proc.stdout
    assert "WORLD_SIZE=2, but the Hugging Face Trainer runs 1 process" in warned[0]
    assert "each rank trains its own identical copy" in warned[0]
    assert 'HINT: on CPU pass TrainingArguments(use_cpu=True, ddp_backend="gloo")' in warned[0]


def test_lightning_trainer_must_have_the_shape_of_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 nodes x 2 ranks from hpc_train: trainer_shape() gives Lightning that shape; a Trainer of another shape
    is refused when the callback is set up, with the fix in the message."""
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    for name in [k for k in list(os.environ) if k.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)  # Lightning would pick its Slurm or torchelastic environment instead
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = python("""
        import lightning.pytorch as pl
        from hpc_train.core.errors import ConfigError, DistEnvironmentError
        from hpc_train.integrations.lightning import PreemptionCallback, trainer_shape

        def errors(environ):
            try:
                return trainer_shape(environ)
            except DistEnvironmentError as exc:
                return type(exc).__name__

        print("SHAPE", trainer_shape())
        print("TABLE", [errors(e) for e in ({}, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, {"WORLD_SIZE": "2"},
                                             {"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})])
        quiet = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
        model = pl.LightningModule()
        matching = pl.Trainer(**trainer_shape(), strategy="ddp", **quiet)
        PreemptionCallback().setup(matching, model, "fit")  # no error
        try:
            PreemptionCallback().setup(pl.Trainer(devices=1, **quiet), model, "fit")
        except ConfigError as exc:
            print("REFUSED", exc)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    assert lines["SHAPE"] == "{'devices': 2, 'num_nodes': 2}"
    assert lines["TABLE"] == (
        "[{'devices': 1, 'num_nodes': 1}, {'devices': 4, 'num_nodes': 2}, 'DistEnvironmentError', "
        "'DistEnvironmentError']"
    )
    refused = lines["REFUSED"]
    assert "devices=1, num_nodes=1, but this job runs devices=2, num_nodes=2" in refused
    assert "HINT: L.Trainer(**trainer_shape(), ...)" in refused
    assert 'devices=int(os.environ["LOCAL_WORLD_SIZE"])' in refused
    assert 'num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"])' in refused


def test_lightning_resume_parts_the_sampler_skip_and_the_random_state(tmp_path: Path) -> None:
    """What the Lightning callback adds for an exact mid-epoch resume, piece by piece: the resumed epoch skips its
    trained batches once, in the epoch's own order; every random state comes back from a weights-only load."""
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    proc = python(f"""
        import random
        import numpy as np, torch
        from torch.utils.data import DistributedSampler, TensorDataset
        from hpc_train.integrations.lightning import _SkipFirst, _random_state, _set_random_state

        sampler = DistributedSampler(TensorDataset(torch.arange(20)), num_replicas=2, rank=1, shuffle=True, seed=3)
        sampler.set_epoch(2)
        whole = list(sampler)
        skipping = _SkipFirst(sampler, 4)
        skipping.set_epoch(2)  # the sampler's own methods go through
        assert len(skipping) == len(sampler) == 10  # Lightning counts the epoch whole
        assert list(skipping) == whole[4:], list(skipping)  # the epoch's own order, from its 5th item
        assert list(skipping) == whole  # once: the next epoch is whole

        torch.manual_seed(1), np.random.seed(2), random.seed(3)
        torch.save({{"random": [_random_state()]}}, {str(tmp_path / "state.pt")!r})
        expected = torch.rand(3), np.random.rand(3), random.random()
        torch.manual_seed(9), np.random.seed(9), random.seed(9)
        _set_random_state(torch.load({str(tmp_path / "state.pt")!r}, weights_only=True)["random"][0])
        again = torch.rand(3), np.random.rand(3), random.random()
        assert torch.equal(expected[0], again[0]) and (expected[1] == again[1]).all() and expected[2] == again[2]
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-3000:]
