"""Schedules, early stopping, strategies, precision and user-code checks, without multi-process runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpc_train.config import DDPConfig, EarlyStoppingConfig, ScheduleConfig, ScriptConfig, TrainerConfig
from hpc_train.core.errors import ConfigError
from hpc_train.distributed import distributed, resolve_environment
from hpc_train.runtime.script import TORCHRUN_VARIABLES, torchrun_environment
from hpc_train.train.early_stopping import EarlyStopping
from hpc_train.train.models import build_model
from hpc_train.train.precision import Precision
from hpc_train.train.schedule import lr_factor
from hpc_train.train.strategy import wrap_model
from hpc_train.train.usercode import build_loss, build_metric, split_datasets

from .test_config import composed


@pytest.fixture
def process_group():  # type: ignore[no-untyped-def]
    with distributed(resolve_environment({}), torch.device("cpu"), timedelta(seconds=30)):
        yield


@pytest.mark.parametrize(
    ("cfg", "factors"),
    [
        (ScheduleConfig(), [1.0, 1.0, 1.0]),
        (ScheduleConfig(warmup_steps=4), [0.25, 0.5, 0.75, 1.0, 1.0]),
        (ScheduleConfig(name="step", step_every=2, gamma=0.5), [1.0, 1.0, 0.5, 0.5, 0.25]),
        (ScheduleConfig(name="cosine", min_lr_ratio=0.1), [1.0, 0.55, 0.1]),
        (ScheduleConfig(name="cosine", warmup_steps=2), [0.5, 1.0, 1.0, 0.5, 0.0]),
    ],
)
def test_lr_factors(cfg: ScheduleConfig, factors: list[float]) -> None:
    assert [lr_factor(step, len(factors), cfg) for step in range(len(factors))] == pytest.approx(factors)


@pytest.mark.parametrize(
    ("mode", "values", "expected"),
    [
        ("min", [1.0, 0.9, 0.95, 0.91], [(True, False), (True, False), (False, False), (False, True)]),
        ("max", [0.5, 0.6, 0.6, 0.7], [(True, False), (True, False), (False, False), (True, False)]),
    ],
)
def test_early_stopping(process_group, mode: str, values: list[float], expected: list[tuple[bool, bool]]) -> None:  # type: ignore[no-untyped-def]
    es = EarlyStopping(EarlyStoppingConfig(patience=2, mode=mode, monitor="val_acc"), torch.device("cpu"))
    assert [es.update(v) for v in values] == expected


def test_min_delta_and_no_patience(process_group) -> None:  # type: ignore[no-untyped-def]
    es = EarlyStopping(EarlyStoppingConfig(patience=0, min_delta=0.1), torch.device("cpu"))
    assert [es.update(v) for v in (1.0, 0.95, 0.8, 0.79)] == [
        (True, False),
        (False, False),
        (True, False),
        (False, False),
    ]


def test_auto_mode_follows_the_metric() -> None:
    assert EarlyStoppingConfig(monitor="val_loss").direction == "min"
    assert EarlyStoppingConfig(monitor="val_acc").direction == "max"


def test_strategies_wrap(process_group) -> None:  # type: ignore[no-untyped-def]
    model = nn.Linear(3, 2)
    cpu = torch.device("cpu")
    ddp, no_sync = wrap_model(model, "ddp", cpu, DDPConfig(bucket_cap_mb=1, gradient_as_bucket_view=True), 2)
    assert isinstance(ddp, DDP) and no_sync == ddp.no_sync
    assert isinstance(wrap_model(model, "dp", cpu, DDPConfig(), 1)[0], nn.DataParallel)
    assert wrap_model(model, "single", cpu, DDPConfig(), 1)[0] is model
    # One rank needs no gradient all-reduce: the bare model.
    assert wrap_model(model, "ddp", cpu, DDPConfig(), 1)[0] is model


@pytest.mark.parametrize(("name", "dtype", "scaled"), [("fp32", torch.float32, False), ("bf16", torch.bfloat16, False)])
def test_precision(name: str, dtype: torch.dtype, scaled: bool) -> None:
    precision = Precision(name, torch.device("cpu"))
    with precision.autocast():
        assert nn.Linear(2, 2)(torch.randn(1, 2)).dtype == dtype
    assert precision.scaler.is_enabled() is scaled


def test_fp16_has_a_scaler() -> None:
    assert Precision("fp16", torch.device("cpu")).scaler.is_enabled()


def test_default_loss_and_metric() -> None:
    logits, targets = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 0, 0])
    assert isinstance(build_loss(None), nn.CrossEntropyLoss)
    name, metric = build_metric(None)
    assert name == "val_acc" and metric(logits, targets).tolist() == [1.0, 0.0, 1.0]


def test_user_targets() -> None:
    loss = build_loss({"_target_": "torch.nn.MSELoss"})
    assert isinstance(loss, nn.MSELoss)
    with pytest.raises(ConfigError, match=r"trainer\.loss\._target_='torch\.nn\.NoSuchLoss' could not be called"):
        build_loss({"_target_": "torch.nn.NoSuchLoss"})
    with pytest.raises(ConfigError, match="returned int, not a callable"):
        build_metric({"_target_": "builtins.int", "_args_": [3]})
    with pytest.raises(ConfigError, match=r"returned Tensor, not a torch\.nn\.Module"):
        build_model({"_target_": "torch.zeros", "_args_": [2]}, [2], 2)


def test_dataset_shapes_accepted() -> None:
    train, val = torch.utils.data.TensorDataset(torch.zeros(4)), torch.utils.data.TensorDataset(torch.zeros(2))
    assert split_datasets((train, val), "t") == (train, val)
    assert split_datasets({"train": train}, "t") == (train, None)
    assert split_datasets(train, "t") == (train, None)
    with pytest.raises(ConfigError, match="returned str"):
        split_datasets("nope", "t")


def test_torchrun_environment_of_a_slurm_rank() -> None:
    from .test_env import slurm_task

    env = resolve_environment(slurm_task(3))
    got = torchrun_environment(env, composed("cluster=slurm").cluster, "/r")
    assert {
        k: got[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
    } == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "node1",
    }
    assert got["MASTER_PORT"] == str(env.master_port)
    plain = torchrun_environment(env, composed("cluster=slurm").cluster, "/r", torchrun=False)
    assert not set(plain) & set(TORCHRUN_VARIABLES), plain  # script.torchrun_env=false
    assert plain["HPC_TRAIN_RANK"] == "3" and plain["HPC_TRAIN_RUN_DIR"] == "/r"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.strategy=dp", "cluster.gpus_per_node=2"],
            r"trainer\.strategy=dp runs one process, but the cluster asks for 2 ranks",
        ),
        (["trainer.strategy=dp", "cluster.tasks_per_node=1"], r"strategy=dp .* but this run has no GPU .* silently"),
        (["model=transformer"], r"does not suit model=transformer, which needs \[tokens, features\]"),
        (["trainer.early_stopping.monitor=val_metric"], r"monitor=val_metric needs trainer\.metric"),
        (["trainer.precision=fp8"], r"trainer\.precision='fp8'"),
        (["trainer.accumulate_grad_batches=0"], r"trainer\.accumulate_grad_batches=0 is invalid"),
        (["trainer.schedule.name=linear"], r"trainer\.schedule\.name='linear'"),
        (["model=transformer", "data.input_shape=[16,49]", "model.nhead=5"], r"model\.nhead=5 is invalid: must divide"),
        (["script.path=/no/such/script.py"], r"script\.path='/no/such/script\.py' is invalid: no such file"),
        (
            ["script.command=no-such-trainer-cmd"],
            r"script\.command='no-such-trainer-cmd' is invalid: not an executable",
        ),
        (
            ["script.module=m", "script.command=ls"],
            r"script\.command='ls' is invalid: give one of .* not module and",
        ),
        (["model=custom"], r"model\._target_ is not set"),
        (["trainer.loss={a: 1}"], r"trainer\.loss=\{'a': 1\} is invalid: must name a callable in _target_"),
    ],
)
def test_trainer_rules(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        composed(*overrides)


def test_script_path_is_made_absolute(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    from hpc_train.launch.preflight import script_file

    assert script_file("train.py") == str(tmp_path / "train.py")  # at submission (check_paths)
    assert ScriptConfig(path="train.py").path == "train.py"  # building a config changes no value it was given


def test_global_batch_counts_accumulation() -> None:
    cfg = composed("trainer.batch_size=16", "trainer.accumulate_grad_batches=4")
    assert cfg.global_batch_size == 16 * 2 * 4
    assert TrainerConfig().accumulate_grad_batches == 1


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({}, "3 epochs (the default) bind"),
        ({"max_steps": 1500}, "trainer.max_steps=1500 binds"),
        ({"max_steps": 50, "max_epochs": 2}, "trainer.max_steps=50 binds, before 2 epochs"),
        ({"max_steps": 500, "max_epochs": 2}, "trainer.max_epochs=2 binds, before trainer.max_steps=500"),
    ],
)
def test_the_start_up_line_says_which_limit_binds(limits: dict[str, int], said: str) -> None:
    from hpc_train.config import TrainerConfig
    from hpc_train.train.trainer import _shown, binding_limit

    assert binding_limit(TrainerConfig(**limits), steps_per_epoch=100) == said  # type: ignore[arg-type]
    assert _shown("first_step_at", 1.796e9).count(":") == 2 and _shown("lr", 0.001234567) == "0.001235"
