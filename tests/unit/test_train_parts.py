"""Pieces of the trainer that need no process group: LR rule, samplers, data, models, atomic saves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hpc_train.config import CNNConfig, DataConfig, MLPConfig, check_override_keys
from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import RunDir
from hpc_train.runtime.faults import fault_from_env
from hpc_train.train.checkpoint import save_atomic
from hpc_train.train.data import ShardSampler, make_synthetic
from hpc_train.train.models import build_model
from hpc_train.train.optim import scaled_lr


@pytest.mark.parametrize(
    ("rule", "global_batch", "expected"),
    [("none", 512, 0.1), ("linear", 512, 0.2), ("linear", 128, 0.05), ("sqrt", 1024, 0.2), ("sqrt", 64, 0.05)],
)
def test_lr_scaling(rule: str, global_batch: int, expected: float) -> None:
    assert scaled_lr(0.1, rule, global_batch, 256) == pytest.approx(expected)


@pytest.mark.parametrize(("length", "world"), [(409, 2), (10, 3), (7, 8), (100, 4)])
def test_shard_sampler_covers_each_sample_once(length: int, world: int) -> None:
    shards = [list(ShardSampler(length, r, world)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(length))
    assert [len(ShardSampler(length, r, world)) for r in range(world)] == [len(s) for s in shards]


def test_synthetic_data_is_deterministic_and_split() -> None:
    cfg = DataConfig(num_samples=500, val_fraction=0.2, input_shape=[3, 8, 8], num_classes=4)
    (train_a, val_a), (train_b, _) = make_synthetic(cfg), make_synthetic(cfg)
    assert (len(train_a), len(val_a)) == (400, 100)
    assert torch.equal(train_a.tensors[0], train_b.tensors[0]) and torch.equal(train_a.tensors[1], train_b.tensors[1])
    assert train_a.tensors[0].shape == (400, 3, 8, 8)
    assert set(train_a.tensors[1].tolist()) == {0, 1, 2, 3}
    other = make_synthetic(DataConfig(num_samples=500, val_fraction=0.2, input_shape=[3, 8, 8], num_classes=4, seed=1))
    assert not torch.equal(train_a.tensors[0], other[0].tensors[0])


def test_synthetic_data_is_the_class_mean_plus_unit_noise() -> None:
    """make_synthetic adds the means in place, a slice at a time; the numbers are those of the plain formula."""
    cfg = DataConfig(num_samples=5000, val_fraction=0.1, input_shape=[6], num_classes=3, class_separation=2.0)
    train, val = make_synthetic(cfg)  # 5000 rows: more than one slice
    g = torch.Generator().manual_seed(cfg.seed)
    means = torch.randn(3, 6, generator=g)
    means *= 2.0 / means.norm(dim=1, keepdim=True)
    y = torch.randint(3, (5000,), generator=g)
    x = means[y] + torch.randn(5000, 6, generator=g)
    assert torch.equal(torch.cat([val.tensors[0], train.tensors[0]]), x)
    assert torch.equal(torch.cat([val.tensors[1], train.tensors[1]]), y)


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (MLPConfig(hidden_sizes=[32, 16], dropout=0.1), [784]),
        (CNNConfig(channels=[8, 16]), [3, 32, 32]),
        (CNNConfig(channels=[4]), [1, 7, 5]),
    ],
)
def test_models_map_inputs_to_class_logits(model: MLPConfig | CNNConfig, shape: list[int]) -> None:
    net = build_model(model, shape, num_classes=10)
    assert net(torch.randn(5, *shape)).shape == (5, 10)


def test_failed_atomic_write_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    save_atomic({"w": torch.zeros(1)}, target)

    class Unpicklable:
        def __reduce__(self) -> str:
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_atomic({"w": Unpicklable()}, target)
    assert torch.load(target, weights_only=True)["w"].tolist() == [0.0]
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"], "temp file left behind"


def test_status_files_round_trip(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.write_status(0, "running")
    run_dir.write_status(1, "failed", error="boom")
    statuses = run_dir.read_statuses()
    assert (statuses[0]["state"], statuses[1]["state"], statuses[1]["error"]) == ("running", "failed", "boom")
    assert math.isfinite(statuses[0]["time"]) and statuses[0]["pid"] > 0


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["trainer.batch_sise"], r"did you mean trainer\.batch_size\?.*valid keys in trainer:"),
        (["trainr.lr"], r"did you mean 'trainer'\?"),
        (["model.hiden_sizes"], r"did you mean model\.hidden_sizes"),
    ],
)
def test_unknown_override_keys(keys: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_override_keys(keys)


def test_known_override_keys_pass() -> None:
    check_override_keys(["trainer.lr", "model", "model.channels", "optim.momentum", "hydra.run.dir", "cluster.nodes"])


def test_fault_spec() -> None:
    assert fault_from_env("") is None
    fault = fault_from_env("rank=1,step=3,kind=raise")
    assert fault is not None and (fault.rank, fault.step, fault.kind) == (1, 3, "raise")
    fault.at_step(0, 3)
    fault.at_step(1, 2)
    with pytest.raises(RuntimeError, match="injected fault"):
        fault.at_step(1, 3)
    with pytest.raises(ValueError, match="HPC_TRAIN_FAULT"):
        fault_from_env("rank=1")


def test_your_own_model_options_keys_are_overridable(tmp_path: Path) -> None:
    """model.width=128 for a user's conf/model/tiny.yaml (the README's layout), in a sweep too; a typo lists
    that option's keys, not the built-in models'."""
    from hpc_train.config import check_overrides
    from hpc_train.tools.api import compose_config

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny.yaml").write_text("_target_: torch.nn.Linear\nin_features: 784\nout_features: 10\n")
    (tmp_path / "model" / "wide.yaml").write_text("defaults: [schema_mlp, _self_]\nname: mlp\nhidden_sizes: [512]\n")
    cfg = compose_config("model=tiny", "model.out_features=7", config_dir=tmp_path)
    assert cfg.model["out_features"] == 7
    check_overrides(["-m", "model=tiny", "model.out_features=3,5"], [tmp_path])
    check_overrides(["--config-dir", str(tmp_path), "model=tiny", "model.out_features=3"])
    with pytest.raises(
        ConfigError, match=r"valid keys in model \(option tiny\): _target_, in_features, out_features\."
    ):
        check_overrides(["model=tiny", "model.in_feature=3"], [tmp_path])
    with pytest.raises(ConfigError, match=r"did you mean model\.hidden_sizes\?"):
        check_overrides(["model=wide", "model.hiden_sizes=[3]"], [tmp_path])
    # The built-in default (mlp) still lists its own keys only.
    with pytest.raises(ConfigError, match=r"valid keys in model \(option mlp\):"):
        check_overrides(["model.width=3"], [tmp_path])
