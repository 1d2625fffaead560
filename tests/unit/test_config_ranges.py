"""Values in range, checked before launch: every numeric key is finite and fits where it goes (a seed into
torch's generators, seconds into a timedelta, a count into Slurm's fields), cluster.signal can be caught, a
local rank gets no more cores than this machine has, and a ``+key`` the schema lacks is refused like a typo.

Each of these once passed validation and failed on every rank after launch. Most cases build the dataclasses
directly (their ``__post_init__`` is the check): a Hydra composition costs ~0.2 s, so only a few go through it.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from omegaconf import OmegaConf, open_dict

from hpc_train.api import compose_config
from hpc_train.config import (
    INT64_MAX,
    YEAR_MIN,
    YEAR_S,
    AdamWConfig,
    ClusterConfig,
    CNNConfig,
    Config,
    DataConfig,
    DDPConfig,
    EarlyStoppingConfig,
    MLPConfig,
    ScheduleConfig,
    SGDConfig,
    SlurmConfig,
    TrainerConfig,
    TransformerConfig,
    check_overrides,
    config_from_dict,
)
from hpc_train.core.errors import ConfigError
from hpc_train.launch.preflight import check_cpus, preflight, usable_cores

SCHEMAS: list[type[Any]] = [
    ClusterConfig,
    SlurmConfig,
    DataConfig,
    TrainerConfig,
    ScheduleConfig,
    EarlyStoppingConfig,
    DDPConfig,
    MLPConfig,
    CNNConfig,
    TransformerConfig,
    AdamWConfig,
    SGDConfig,
]


def build(schema: type[Any], **values: Any) -> Any:
    """One group's dataclass with these values; a cluster as a Slurm one, so that its Slurm-only keys
    (cluster.slurm) are checked."""
    if schema is SlurmConfig:
        return ClusterConfig(launcher="slurm", slurm=SlurmConfig(**values))
    if schema is ClusterConfig:
        values = {"launcher": "slurm", **values}
    return schema(**values)


def refused(schema: type[Any], key: str, value: Any) -> str:
    """The ConfigError message for ``key=value``, which must name the key with its group and give a HINT."""
    with pytest.raises(ConfigError) as caught:
        build(schema, **{key: value})
    message = str(caught.value)
    assert message.startswith(f"{schema._group}.{key}=") and "HINT:" in message, message
    return message


def _numeric_keys() -> list[tuple[type[Any], str, type]]:
    keys = []
    for schema in SCHEMAS:
        hints = get_type_hints(schema)
        for f in fields(schema):
            kind = hints[f.name]
            if kind in (int, float) or kind == int | None:
                keys.append((schema, f.name, float if kind is float else int))
    return keys


NUMERIC_KEYS = _numeric_keys()


def test_the_walk_finds_the_keys_of_every_group() -> None:
    names = {f"{schema._group}.{key}" for schema, key, _ in NUMERIC_KEYS}
    assert {"trainer.seed", "trainer.ddp.bucket_cap_mb", "cluster.timeout_min", "optim.eps"} <= names
    assert {"trainer.checkpoint_every_min", "trainer.divergence_steps", "trainer.schedule.gamma"} <= names
    assert len(names) > 50


@pytest.mark.parametrize(("schema", "key", "kind"), NUMERIC_KEYS, ids=lambda v: v if isinstance(v, str) else "")
def test_every_numeric_key_is_finite_and_bounded(schema: type[Any], key: str, kind: type) -> None:
    """No numeric key takes inf, nan or a number too big for where it goes, in either direction."""
    bad: list[Any] = [2**64, -(2**64)] if kind is int else [math.inf, -math.inf, math.nan, 1e300, -1e300]
    for value in bad:
        refused(schema, key, value)


@pytest.mark.parametrize(
    ("schema", "key", "value", "rule"),
    [
        (TrainerConfig, "seed", 99999999999999999999, r"whole number from -9223372036854775808 to 9223372036854775807"),
        (TrainerConfig, "seed", -(2**63) - 1, r"whole number from -9223372036854775808 to"),
        (TrainerConfig, "seed", 10**400, r"whole number from -9223372036854775808 to"),  # too big even for a float
        (DataConfig, "seed", 2**63, r"whole number from -9223372036854775808 to"),
        (TrainerConfig, "dist_timeout_s", math.inf, r"finite number above 0 and at most 31536000 \(365 days\)"),
        (TrainerConfig, "preflight_timeout_s", math.inf, r"at most 31536000"),
        (TrainerConfig, "watchdog_s", math.inf, r"finite number from 0 to 31536000"),
        (TrainerConfig, "watchdog_s", math.nan, r"finite number from 0 to 31536000"),
        (TrainerConfig, "checkpoint_every_min", math.inf, r"from 0 to 525600"),
        (TrainerConfig, "divergence_steps", -1, r"whole number from 0"),
        (TrainerConfig, "lr", math.nan, r"finite number above 0 and at most 3\.40282e\+38 \(the largest float32\)"),
        (AdamWConfig, "weight_decay", 1e39, r"from 0 to 3\.40282e\+38"),
        (DDPConfig, "bucket_cap_mb", math.inf, r"above 0 and at most 1048576 \(1 TiB\)"),
        (ClusterConfig, "timeout_min", math.inf, r"above 0 and at most 525600 \(365 days\)"),
        (ClusterConfig, "failure_grace_s", math.inf, r"from 0 to 31536000"),
        (ClusterConfig, "cpus_per_task", 100000, r"whole number from 1 to 65533 \(Slurm keeps it in 16 bits\)"),
        (ClusterConfig, "tasks_per_node", 70000, r"from 1 to 65533"),
        (ClusterConfig, "gpus_per_node", 200, r"from 0 to 128"),
        (SlurmConfig, "signal_lead_s", 70000, r"sbatch --signal takes at most 65535"),
        (SlurmConfig, "srun_wait_s", 10**12, r"from 0 to 31536000"),
    ],
)
def test_out_of_range_values_are_refused(schema: type[Any], key: str, value: Any, rule: str) -> None:
    message = refused(schema, key, value)
    assert re.search(rule, message), message
    assert f"HINT: e.g. {schema._group}.{key}=" in message


@pytest.mark.parametrize(
    ("schema", "values"),
    [
        (TrainerConfig, {"seed": 0}),
        (TrainerConfig, {"seed": -1}),  # accepted before ranges were checked: old run dirs must still resume
        (TrainerConfig, {"seed": INT64_MAX}),
        (DataConfig, {"seed": INT64_MAX}),
        (TrainerConfig, {"dist_timeout_s": YEAR_S, "preflight_timeout_s": YEAR_S, "watchdog_s": YEAR_S}),
        (TrainerConfig, {"dist_timeout_s": 0.001, "watchdog_s": 0, "checkpoint_every_min": 0}),
        (TrainerConfig, {"checkpoint_every_min": YEAR_MIN, "divergence_steps": 0, "max_steps": INT64_MAX}),
        (DDPConfig, {"bucket_cap_mb": 1024 * 1024}),
        (
            ClusterConfig,
            {"timeout_min": YEAR_MIN, "failure_grace_s": YEAR_S, "srun_wait_s": YEAR_S, "signal_lead_s": "auto"},
        ),
        (ClusterConfig, {"cpus_per_task": 65533, "tasks_per_node": 65533, "signal_lead_s": 65535, "timeout_min": 1200}),
        (ClusterConfig, {"gpus_per_node": 128, "tasks_per_node": 128}),
        (ClusterConfig, {"nodes": 2**31 - 1, "tasks_per_node": 1}),
    ],
)
def test_edge_values_in_range_pass(schema: type[Any], values: dict[str, Any]) -> None:
    cfg = build(schema, **values)
    assert all(getattr(cfg, key) == value for key, value in values.items())


def test_more_ranks_than_torch_can_number_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.nodes=65536 is invalid: 65536 nodes x 65533 tasks per node"):
        build(ClusterConfig, nodes=65536, tasks_per_node=65533)


def test_command_line_values_reach_the_checks() -> None:
    """As typed: Hydra reads inf as a float and a long number as an int; the check names the key."""
    with pytest.raises(
        ConfigError, match=r"^trainer\.seed=99999999999999999999 is invalid: .*HINT: e\.g\. trainer\.seed=0"
    ):
        compose_config("trainer.seed=99999999999999999999")
    base = {"model": {"name": "mlp"}, "optim": {"name": "adamw"}}  # a saved config.yaml's strings
    for group, key in [("trainer", "dist_timeout_s"), ("cluster", "timeout_min"), ("trainer", "watchdog_s")]:
        with pytest.raises(ConfigError, match=rf"^{group}\.{key}=inf is invalid: must be a finite number"):
            config_from_dict({**base, group: {key: "inf"}})


@pytest.mark.parametrize("launcher", ["local", "slurm"])
@pytest.mark.parametrize("name", ["KILL", "STOP", "SIGKILL", "stop"])
def test_a_signal_that_cannot_be_caught_is_refused(name: str, launcher: str) -> None:
    """On every launcher: each rank installs a handler for cluster.signal, which KILL and STOP cannot have."""
    with pytest.raises(ConfigError) as caught:
        ClusterConfig(launcher=launcher, signal=name)
    message = str(caught.value)
    assert message.startswith(
        f"cluster.signal={name!r} is invalid: SIG{name.upper().removeprefix('SIG')} cannot be caught"
    )
    assert "HINT: use cluster.signal=USR2 (or USR1, TERM)" in message


@pytest.mark.parametrize("name", ["CHLD", "CONT", "TSTP", "URG", "ALRM", "SEGV", "ABRT", "USR3", "12", "QUIT", "XCPU"])
def test_a_signal_that_is_no_stop_notice_is_refused(name: str) -> None:
    """CHLD would arrive whenever a DataLoader worker exits, CONT after every STOP, SEGV with a crash. QUIT and
    XCPU are not caught from a rank's first line (EARLY_STOP_SIGNALS): one during start-up would dump core."""
    with pytest.raises(ConfigError, match=r"must be a signal the ranks can catch as a stop notice: one of USR2, USR1"):
        ClusterConfig(launcher="slurm", signal=name)


@pytest.mark.parametrize("name", ["USR2", "usr1", "SIGTERM", "INT", "HUP"])
def test_stop_signals_pass(name: str) -> None:
    assert ClusterConfig(launcher="slurm", signal=name).signal == name


def _local(cpus: int, launcher: str = "local") -> Config:
    cluster = ClusterConfig(launcher=launcher, tasks_per_node=1, cpus_per_task=cpus)
    return Config(cluster=cluster, model=MLPConfig(), optim=AdamWConfig())


def test_a_local_rank_gets_no_more_cores_than_this_machine_has() -> None:
    """Checked before launch, against this machine: not in the config's own checks, which also run on compute
    nodes and in `jobs status` (a config with 64 CPUs per task builds anywhere)."""
    with pytest.raises(ConfigError) as caught:
        check_cpus(_local(3), cores=2)
    message = str(caught.value)
    assert message.startswith("cluster.cpus_per_task=3 asks for 3 CPU cores per rank, but this machine has 2 usable")
    assert "HINT: set cluster.cpus_per_task=2 or less" in message
    with pytest.raises(ConfigError, match=r"cluster\.cpus_per_task=3 .*cluster\.launcher=debug"):
        check_cpus(_local(3, "debug"), cores=2)
    check_cpus(_local(2), cores=2)
    check_cpus(_local(64, "slurm"), cores=2)  # Slurm's nodes, not this machine


def test_preflight_checks_the_cores() -> None:
    too_many = usable_cores() + 1
    with pytest.raises(ConfigError, match=rf"cluster\.cpus_per_task={too_many} asks for {too_many} CPU cores"):
        preflight(_local(too_many))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["+trainer.typo=1"], r"unknown config key 'trainer\.typo'\. HINT: valid keys in trainer: "),
        (["++trainer.typo=1"], r"unknown config key 'trainer\.typo'"),
        (["+trainer.sed=1"], r"did you mean trainer\.seed\?"),
        (["+cluster.foo=1"], r"unknown config key 'cluster\.foo'"),
        (["+trainer.ddp.typo=1"], r"unknown config key 'trainer\.ddp\.typo'\. HINT: valid keys in trainer\.ddp: "),
        (["trainer.ddp.bucket_cap=1"], r"did you mean trainer\.ddp\.bucket_cap_mb\?"),
        (["+trainer.early_stopping.patiense=3"], r"did you mean trainer\.early_stopping\.patience\?"),
        (["+model.widht=3"], r"unknown config key 'model\.widht'\. HINT: valid keys in model \(option mlp\)"),
        (["-m", "+trainer.typo=1,2"], r"unknown config key 'trainer\.typo'"),
    ],
)
def test_an_added_key_the_schema_lacks_is_refused(argv: list[str], message: str) -> None:
    """Hydra's + adds a key to the schema's node, where nothing reads it: refused like a typo without a +."""
    with pytest.raises(ConfigError, match=message):
        check_overrides(argv)


def test_what_a_plus_may_add_still_passes(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "quick.yaml").write_text("# @package _global_\ntrainer:\n  max_steps: 5\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny.yaml").write_text("_target_: torch.nn.Linear\nin_features: 784\nout_features: 10\n")
    check_overrides(["+experiment=quick"], [tmp_path])  # a config group of your own
    check_overrides(["+experiment=quick", "+model.width=3"], [tmp_path])  # it may pick its own model
    check_overrides(["model=tiny", "+model.bias=false"], [tmp_path])  # a new argument of your _target_
    check_overrides(["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=3"])
    check_overrides(["+cluster.sbatch_args.mail-type=END", "+data.dataset.n=3", "+trainer.loss.reduction=sum"])
    check_overrides(["++trainer.lr=0.1", "+hydra.job.env_set.X=1", "trainer.ddp.bucket_cap_mb=50"])


def test_a_key_added_to_a_typed_node_is_refused_when_the_config_is_built() -> None:
    """The same refusal where the config is built (the Python API, a sweep element), for a key that Hydra's
    + (force-add) put into a structured node; a mapping of your own keeps any keys."""
    for node_path in ("trainer", "trainer.ddp", "model"):
        raw = OmegaConf.structured(Config(model=MLPConfig(), optim=AdamWConfig()))
        node = OmegaConf.select(raw, node_path)
        with open_dict(node):
            node.typo = 1
        with pytest.raises(
            ConfigError, match=rf"^unknown config key '{re.escape(node_path)}\.typo'\. HINT: valid keys"
        ):
            config_from_dict(raw)
    raw = OmegaConf.structured(Config(model=MLPConfig(), optim=AdamWConfig()))
    with open_dict(raw):
        raw.cluster.launcher = "slurm"  # (sbatch_args is Slurm's)
        raw.cluster.slurm.sbatch_args["mail-type"] = "END"
    assert config_from_dict(raw).cluster.slurm.sbatch_args == {"mail-type": "END"}
