"""The Slurm-only keys live under ``cluster.slurm``; their old flat names (``cluster.partition``) keep working
on the command line, in users' profiles and experiment files, in run dirs saved before the move, and in
``ClusterConfig(...)``. Two values for one key are refused, except that the command line beats a file."""

from __future__ import annotations

import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hpc_train.api import compose_config
from hpc_train.config import (
    RESUME_SAFE_KEYS,
    SLURM_ONLY,
    ClusterConfig,
    Config,
    SlurmConfig,
    config_from_dict,
    load_config,
    slurm_alias_overrides,
)
from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config

GOLDEN = Path(__file__).parent.parent / "golden" / "config_flat_v0.yaml"
"""A config.yaml written by hpc_train before the Slurm keys moved (631ff8a): a dry run with
cluster.partition=debug, max_restarts=3, spare_nodes=1, sbatch_args, setup, signal_lead_s, job_name, exclude."""


def test_the_slurm_keys_are_one_level_down_and_named_once() -> None:
    assert tuple(f.name for f in fields(SlurmConfig)) == SLURM_ONLY and len(SLURM_ONLY) == 27
    assert not set(SLURM_ONLY) & {f.name for f in fields(ClusterConfig)}
    # Every key a resubmission may change still names a key of the schema (no stale flat name).
    schema = OmegaConf.structured(Config)
    for key in RESUME_SAFE_KEYS:
        assert OmegaConf.select(schema, key, default="<missing>") != "<missing>", key


@pytest.mark.parametrize("key", SLURM_ONLY)
def test_every_old_name_on_the_command_line_is_rewritten(key: str) -> None:
    assert slurm_alias_overrides([f"cluster.{key}=v", f"+cluster.{key}=v", "cluster.nodes=2"]) == [
        f"cluster.slurm.{key}=v",
        f"+cluster.slurm.{key}=v",
        "cluster.nodes=2",
    ]


def test_the_rewrite_leaves_values_and_other_keys_alone() -> None:
    argv = [
        "cluster=slurm",
        "cluster.sbatch_args.mail-user=a@b.c",
        "cluster.partition=a,b",
        "cluster.slurm.qos=high",
        "cluster.signal=USR1",
        "cluster.submitter=x",  # not an alias: left for the key check to refuse
        "trainer.lr=0.1",
        "-m",
    ]
    assert slurm_alias_overrides(argv) == [
        "cluster=slurm",
        "cluster.slurm.sbatch_args.mail-user=a@b.c",
        "cluster.slurm.partition=a,b",
        "cluster.slurm.qos=high",
        "cluster.signal=USR1",
        "cluster.submitter=x",
        "trainer.lr=0.1",
        "-m",
    ]


def test_old_and_new_names_compose_to_the_same_config() -> None:
    old = compose_config(
        "cluster=slurm",
        "cluster.partition=debug",
        "cluster.max_restarts=3",
        "cluster.sbatch_args={mail-type: END}",
        "cluster.sbatch_args.mail-user=a@b.c",
        'cluster.exclude="node[1-2]"',
    )
    new = compose_config(
        "cluster=slurm",
        "cluster.slurm.partition=debug",
        "cluster.slurm.max_restarts=3",
        "cluster.slurm.sbatch_args={mail-type: END}",
        "cluster.slurm.sbatch_args.mail-user=a@b.c",
        'cluster.slurm.exclude="node[1-2]"',
    )
    assert old == new
    assert new.cluster.slurm.sbatch_args == {"mail-type": "END", "mail-user": "a@b.c"}
    assert (new.cluster.slurm.partition, new.cluster.slurm.exclude) == ("debug", "node[1-2]")


def test_one_key_in_both_spellings_on_the_command_line() -> None:
    assert compose_config("cluster=slurm", "cluster.qos=a", "cluster.slurm.qos=a").cluster.slurm.qos == "a"
    with pytest.raises(ConfigError, match=r"cluster\.qos=a and cluster\.slurm\.qos=b set one key twice.*HINT"):
        compose_config("cluster=slurm", "cluster.qos=a", "cluster.slurm.qos=b")


def test_a_typo_names_the_nested_key() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown config key 'cluster\.partiton'\. HINT: did you mean cluster\.slurm\.partition\?"
    ):
        compose_config("cluster=slurm", "cluster.partiton=x")


def _profile(tmp_path: Path, text: str, name: str = "old") -> Path:
    conf = tmp_path / "conf"
    (conf / "cluster").mkdir(parents=True, exist_ok=True)
    (conf / "cluster" / f"{name}.yaml").write_text("defaults: [slurm, _self_]\n" + text)
    return conf


def test_a_profile_with_the_old_flat_keys_still_composes(tmp_path: Path) -> None:
    conf = _profile(
        tmp_path, "partition: debug\nmax_failures: 7\nsetup: ['module load x']\nsbatch_args: {mail-type: END}\n"
    )
    experiment = conf / "experiment"
    experiment.mkdir()
    (experiment / "q.yaml").write_text("# @package _global_\ncluster:\n  account: proj\n")
    cfg = compose_config("cluster=old", "+experiment=q", config_dir=conf)
    slurm = cfg.cluster.slurm
    assert (slurm.partition, slurm.max_failures, slurm.setup, slurm.account) == ("debug", 7, ["module load x"], "proj")
    assert slurm.sbatch_args == {"mail-type": "END"}
    # The command line beats the profile, in either spelling.
    assert (
        compose_config("cluster=old", "cluster.slurm.partition=all", config_dir=conf).cluster.slurm.partition == "all"
    )
    assert compose_config("cluster=old", "cluster.partition=all", config_dir=conf).cluster.slurm.partition == "all"
    both = compose_config("cluster=old", "cluster.slurm.sbatch_args={mail-type: FAIL}", config_dir=conf)
    assert both.cluster.slurm.sbatch_args == {"mail-type": "FAIL"}


def test_a_profile_that_sets_one_key_twice_is_refused(tmp_path: Path) -> None:
    conf = _profile(tmp_path, "partition: a\nslurm:\n  partition: b\n")
    with pytest.raises(
        ConfigError, match=r"cluster\.partition='a' and cluster\.slurm\.partition='b' are both set.*HINT: keep one"
    ):
        compose_config("cluster=old", config_dir=conf)
    agreeing = _profile(
        tmp_path, "partition: a\nslurm:\n  partition: a\n  sbatch_args: {x: '1'}\nsbatch_args: {y: '2'}\n", "ok"
    )
    cfg = compose_config("cluster=ok", config_dir=agreeing)
    assert cfg.cluster.slurm.partition == "a" and cfg.cluster.slurm.sbatch_args == {"x": "1", "y": "2"}
    clash = _profile(tmp_path, "slurm:\n  sbatch_args: {x: '1'}\nsbatch_args: {x: '2'}\n", "clash")
    with pytest.raises(ConfigError, match=r"cluster\.sbatch_args\.x='2' and cluster\.slurm\.sbatch_args\.x='1'"):
        compose_config("cluster=clash", config_dir=clash)


def test_a_typo_in_a_profile_is_refused_with_the_nested_key(tmp_path: Path) -> None:
    conf = _profile(tmp_path, "partiton: debug\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'cluster\.partiton'\. HINT: did you mean 'slurm\.partition'\?"
    ):
        compose_config("cluster=old", config_dir=conf)


def test_a_run_dir_saved_before_the_move_loads_and_resumes(tmp_path: Path) -> None:
    saved = load_config(GOLDEN)
    slurm = saved.cluster.slurm
    assert (slurm.partition, slurm.max_restarts, slurm.spare_nodes, slurm.exclude) == ("debug", 3, 1, "node3")
    assert (slurm.sbatch_args, slurm.setup, slurm.signal_lead_s, slurm.job_name) == (
        {"mail-type": "END"},
        ["export X=1"],
        "60",  # a string since it may hold auto; the saved 60 loads as its digits
        "gold",
    )
    # A resubmission of that run dir with the same values, spelled either way, finds no difference.
    run_dir = RunDir(tmp_path)
    shutil.copy(GOLDEN, run_dir.config)
    write_config(saved, run_dir)
    assert load_config(run_dir.config) == saved
    shutil.copy(GOLDEN, run_dir.config)
    with pytest.raises(ConfigError, match=r"differs in what that run was trained with \(trainer\.lr: "):
        write_config(replace(saved, trainer=replace(saved.trainer, lr=saved.trainer.lr * 2)), run_dir)
    # A saved file that holds both spellings with different values is refused, naming both.
    text = GOLDEN.read_text().replace("  partition: debug\n", "  partition: debug\n  slurm:\n    partition: other\n")
    with pytest.raises(ConfigError, match=r"cluster\.partition='debug' and cluster\.slurm\.partition='other'"):
        config_from_dict(OmegaConf.to_container(OmegaConf.create(text)))  # type: ignore[arg-type]


def test_the_python_constructor_and_attributes_take_the_old_names() -> None:
    cluster = ClusterConfig(launcher="slurm", partition="gpu", max_restarts=3)
    assert (cluster.slurm.partition, cluster.partition, cluster.max_restarts) == ("gpu", "gpu", 3)  # type: ignore[attr-defined]
    cluster.qos = "high"  # type: ignore[attr-defined]
    assert cluster.slurm.qos == "high"
    moved = replace(cluster, slurm=replace(cluster.slurm, partition="cpu"))
    assert moved.slurm.partition == "cpu" and moved.nodes == cluster.nodes
    assert ClusterConfig(launcher="slurm", slurm=SlurmConfig(qos="a"), qos="a").slurm.qos == "a"
    with pytest.raises(ConfigError, match=r"cluster\.qos='b' and cluster\.slurm\.qos='a' are both set"):
        ClusterConfig(launcher="slurm", slurm=SlurmConfig(qos="a"), qos="b")


def test_a_local_run_warns_under_the_nested_name() -> None:
    with pytest.warns(UserWarning, match=r"cluster\.slurm\.partition is ignored by cluster\.launcher=local"):
        compose_config("cluster.partition=gpu")
