"""Config: the YAML tree composes into the typed schema, and every bad value fails with key, value and HINT."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from hpc_train.api import compose_config
from hpc_train.config import (
    AdamWConfig,
    ClusterConfig,
    CNNConfig,
    Config,
    MLPConfig,
    SGDConfig,
    config_from_dict,
    load_config,
    resolve,
)
from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config

from ..conftest import CONF


def composed(*overrides: str) -> Config:
    """The config `python -m hpc_train <overrides>` would run (composed by Hydra, validated)."""
    return compose_config(*overrides)


def test_defaults() -> None:
    cfg = composed()
    assert cfg.cluster.launcher == "local"
    assert (cfg.cluster.nodes, cfg.cluster.tasks_per_node, cfg.cluster.gpus_per_node, cfg.cluster.cpus_per_task) == (
        1,
        2,
        0,
        1,
    )
    assert isinstance(cfg.model, MLPConfig)
    assert cfg.global_batch_size == 128


def test_group_options() -> None:
    cfg = composed("model=cnn", "data.input_shape=[3,32,32]", "optim=sgd", "cluster=debug")
    assert isinstance(cfg.model, CNNConfig)
    assert isinstance(cfg.optim, SGDConfig)
    assert (cfg.cluster.launcher, cfg.cluster.tasks_per_node) == ("debug", 1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.batch_size=0"], r"trainer\.batch_size=0 is invalid: must be a whole number from 1 to .*\. HINT:"),
        (["trainer.lr=-1"], r"trainer\.lr=-1\.0 is invalid: must be a finite number above 0"),
        (
            ["trainer.lr_scaling=linaer"],
            r"trainer\.lr_scaling='linaer'.*one of none, linear, sqrt.*did you mean 'linear'",
        ),
        (["trainer.max_epochs=0", "trainer.max_steps=0"], r"training would never end\. HINT: set trainer\.max_epochs"),
        (["cluster.nodes=2"], r"cluster\.nodes=2 is invalid: the local launcher runs on this machine only"),
        (["cluster=debug", "cluster.tasks_per_node=2"], r"cluster\.tasks_per_node=2.*debug launcher runs one process"),
        (["cluster.launcher=slurmm"], r"cluster\.launcher='slurmm'"),
        (["data.val_fraction=1.5"], r"data\.val_fraction=1\.5 is invalid: must be in \[0, 1\)"),
        (["model=cnn"], r"data\.input_shape=\[784\] does not suit model=cnn.*HINT: set data\.input_shape=\[3,32,32\]"),
        (
            ["data.num_samples=100"],
            r"trainer\.batch_size=64 x trainer\.accumulate_grad_batches=1 is more than the 45 training samples each of 2 ranks",
        ),
        (
            ["data.num_samples=2", "data.val_fraction=0.5", "trainer.batch_size=1", "data.drop_last=false"],
            r"leaves 1 validation samples for 2 ranks",
        ),
        (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], r"optim\.nesterov=True.*HINT"),
        (["model.dropout=1"], r"model\.dropout=1\.0 is invalid"),
        (["trainer.device=cuda"], r"trainer\.device=cuda, but cluster\.gpus_per_node=0 gives the ranks no GPU.*HINT"),
        (["cluster=slurm", "trainer.device=cuda"], r"cluster\.gpus_per_node=0 gives the ranks no GPU"),
        (["cluster.gpus_per_node=1"], r"cluster\.tasks_per_node=2 is invalid: 2 tasks per node would share 1 GPUs"),
        (
            ["cluster=slurm", "cluster.gpus_per_node=-2"],
            r"^cluster\.gpus_per_node=-2 is invalid: must be a whole number from 0",
        ),
        (
            ["script.path=train.py", "script.torchrun_env=false"],
            r"script\.torchrun_env=false runs the script as one plain process.*asks for 2 ranks.*HINT: set "
            r"cluster\.nodes=1 cluster\.tasks_per_node=1",
        ),
        (["script.torchrun_env=false"], r"script\.torchrun_env=false applies to a script of your own.*HINT"),
    ],
)
def test_rules(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        composed(*overrides)


def test_cuda_without_gpus_is_fine_where_the_gpus_stay_visible() -> None:
    assert composed("cluster=debug", "trainer.device=cuda").trainer.device == "cuda"  # in-process
    assert composed("trainer.device=cuda", "cluster.gpus_per_node=2").cluster.tasks_per_node == 2


def test_wrong_type_rejected_while_composing() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        composed("trainer.batch_size=abc")


def test_unknown_key_lists_valid_keys() -> None:
    raw = OmegaConf.to_container(OmegaConf.structured(Config(model=MLPConfig(), optim=SGDConfig())))
    assert isinstance(raw, dict)
    raw["trainer"]["batch_sise"] = 3
    with pytest.raises(
        ConfigError,
        match=r"unknown config key 'trainer\.batch_sise'.*did you mean 'batch_size'.*valid keys here: .*max_steps",
    ):
        config_from_dict(raw)


def test_unknown_model_name() -> None:
    raw = OmegaConf.to_container(OmegaConf.structured(Config(model=MLPConfig(), optim=SGDConfig())))
    assert isinstance(raw, dict)
    raw["model"]["name"] = "resnet"
    with pytest.raises(ConfigError, match=r"model\.name='resnet' is not a known model: choose one of cnn, mlp"):
        config_from_dict(raw)


def test_saved_config_round_trips(tmp_path: Path) -> None:
    cfg = composed("model=cnn", "data.input_shape=[3,32,32]", "optim=sgd", "trainer.lr=0.25")
    write_config(cfg, RunDir(tmp_path))
    assert load_config(tmp_path / "config.yaml") == cfg


def test_write_config_refuses_to_replace_another_run(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    write_config(composed(), run_dir)
    write_config(composed(), run_dir)  # the same config again is fine (re-running in place)
    before = run_dir.config.read_text()
    with pytest.raises(
        ConfigError, match=r"differs in what that run was trained with \(trainer\.lr: 0\.0001 -> 0\.5\)"
    ):
        write_config(composed("trainer.lr=0.5", "trainer.max_steps=50"), run_dir)
    assert run_dir.config.read_text() == before
    write_config(composed("trainer.max_steps=50", "trainer.log_every_n_steps=5"), run_dir)  # train longer: fine
    assert load_config(run_dir.config).trainer.max_steps == 50


def _schema_of(yaml_file: Path) -> type:
    from hpc_train.config import MODEL_SCHEMAS, OPTIM_SCHEMAS, ClusterConfig, DataConfig, TrainerConfig

    group, option = yaml_file.parent.name, yaml_file.stem
    by_option = {"model": MODEL_SCHEMAS, "optim": OPTIM_SCHEMAS}
    return (
        by_option[group][option]
        if group in by_option
        else {"cluster": ClusterConfig, "data": DataConfig, "trainer": TrainerConfig}[group]
    )


def _declared_default(f: dataclasses.Field[Any]) -> Any:
    """A field's default as written in the dataclass (not as __post_init__ may derive it)."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return f.default


def _option_files() -> list[Path]:
    return [p for p in sorted(CONF.glob("*/*.yaml")) if p.name != "custom.yaml"]  # custom: a _target_ only


@pytest.mark.parametrize("yaml_file", _option_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_option_files_state_only_what_differs_from_the_schema(yaml_file: Path) -> None:
    """One source of truth: a YAML value equal to the schema's default is a second copy that can drift (as
    trainer.lr_reference_batch_size once did: 128 in YAML, 64 in the dataclass)."""
    schema = _schema_of(yaml_file)
    defaults = {f.name: _declared_default(f) for f in dataclasses.fields(schema)}
    values = OmegaConf.to_container(OmegaConf.load(yaml_file))
    assert isinstance(values, dict)
    values.pop("defaults", None)
    if "@package _global_" in yaml_file.read_text().splitlines()[0]:  # sets another group's key too (sgd: lr)
        others = {k: v for k, v in values.items() if k != yaml_file.parent.name}
        assert set(others) <= {"trainer"}, others
        composed(f"{yaml_file.parent.name}={yaml_file.stem}")  # and those keys compose and validate
        values = values[yaml_file.parent.name]
    unknown = sorted(set(values) - set(defaults))
    assert not unknown, f"{yaml_file.name} sets keys the schema {schema.__name__} lacks: {unknown}"
    # name (model/optim/data) and launcher (cluster) say which option this is; they may equal the default.
    restated = sorted(k for k, v in values.items() if k not in ("name", "launcher") and v == defaults[k])
    assert not restated, f"{yaml_file} restates {schema.__name__}'s defaults for {restated}: remove them there"


def test_default_job_is_the_schema_defaults() -> None:
    """`hpc-train` with no overrides runs exactly what the dataclasses say, except what cluster/local.yaml
    changes on purpose (2 ranks). Code that builds the dataclasses itself (notebooks, tests) gets the same."""
    expected = Config(cluster=ClusterConfig(tasks_per_node=2), model=MLPConfig(), optim=AdamWConfig())
    assert composed() == expected


@pytest.mark.parametrize(
    ("overrides", "direction"),
    [
        ([], "min"),
        (["trainer.early_stopping.monitor=val_acc"], "max"),
        (["trainer.early_stopping.monitor=val_metric", "trainer.metric={_target_: torch.nn.CosineSimilarity}"], "max"),
        (
            [
                "trainer.early_stopping.monitor=val_metric",
                "trainer.early_stopping.mode=min",
                "trainer.metric={_target_: torch.nn.L1Loss}",
            ],
            "min",
        ),
    ],
)
def test_early_stopping_direction_follows_the_final_monitor(overrides: list[str], direction: str) -> None:
    """mode=auto is resolved from the monitor the command line chose, not from the schema's default val_loss."""
    from hpc_train.train.early_stopping import EarlyStopping

    cfg = composed(*overrides)
    assert cfg.trainer.early_stopping.direction == direction
    assert cfg.trainer.early_stopping.mode in ("auto", "min")  # saved as written, resolved when read
    stopper = EarlyStopping(cfg.trainer.early_stopping, device=None)  # type: ignore[arg-type]
    stopper.best = 0.5
    assert stopper._improved(0.6) == (direction == "max")
    assert stopper._improved(0.4) == (direction == "min")


@pytest.mark.parametrize(
    ("overrides", "epoch_limit"),
    [
        ([], 3),  # neither set: the default 3 epochs
        (["trainer.max_steps=1500"], 0),  # max_steps alone governs (Lightning's convention)
        (["trainer.max_steps=1500", "trainer.max_epochs=2"], 2),  # both: whichever comes first
        (["trainer.max_epochs=0", "trainer.max_steps=10"], 0),
    ],
)
def test_max_steps_lifts_the_default_epoch_limit(overrides: list[str], epoch_limit: int) -> None:
    assert composed(*overrides).trainer.epoch_limit == epoch_limit


def test_script_args_as_a_string_split_like_a_shell(tmp_path: Path) -> None:
    from hpc_train.config import ScriptConfig, check_override_syntax

    assert ScriptConfig(args='--tag "a,b" --lr=1e-3').argv == ["--tag", "a,b", "--lr=1e-3"]
    assert ScriptConfig(args=["--epochs", 3]).argv == ["--epochs", "3"]
    with pytest.raises(ConfigError, match=r"script\.args=.*balanced quotes.*HINT: script\.args='--tag"):
        ScriptConfig(args='--tag "a')
    with pytest.raises(ConfigError, match=r"HINT: give the arguments as one string.*or after a lone --"):
        check_override_syntax(['script.args=[--tag,"a,b",--lr=1e-3]'])


def test_sbatch_args_take_new_keys_without_a_plus() -> None:
    cfg = composed("cluster=slurm", "cluster.sbatch_args={mail-type: END}", "cluster.sbatch_args.mail-user=me@x.org")
    assert cfg.cluster.sbatch_args == {"mail-type": "END", "mail-user": "me@x.org"}
    with pytest.raises(ConfigError, match=r"--time is set by hpc_train\. HINT: use cluster\.timeout_min"):
        composed("cluster=slurm", "cluster.sbatch_args.time=10")


def test_a_run_dir_saved_by_an_older_version_resumes(tmp_path: Path) -> None:
    """Keys added since (trainer.init_from, cluster.container) and the once-resolved early stopping mode are no
    difference; a real one still is."""
    run_dir = RunDir(tmp_path)
    write_config(composed(), run_dir)
    old = OmegaConf.load(run_dir.config)
    del old.trainer["init_from"], old.cluster.slurm["container"]
    old.trainer.early_stopping.mode, old.trainer.max_epochs = "min", 3
    run_dir.config.write_text(OmegaConf.to_yaml(old))
    write_config(composed("trainer.max_epochs=3"), run_dir)
    with pytest.raises(ConfigError, match=r"trainer\.early_stopping\.mode: 'min' -> 'max'"):
        write_config(composed("trainer.max_epochs=3", "trainer.early_stopping.mode=max"), run_dir)


def test_resume_command_and_labels_of_a_run_from_a_config_folder(tmp_path: Path) -> None:
    from hpc_train.core.rundir import run_labels
    from hpc_train.launch.state import resume_command

    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    write_config(composed("trainer.lr=0.1"), run_dir, ["--config-dir=/my repo/conf", "trainer.lr=0.1"])
    assert resume_command(run_dir).endswith("'--config-dir=/my repo/conf' trainer.lr=0.1")
    assert run_labels([run_dir]) == ["trainer.lr=0.1"] and run_dir.tensorboard_run.name == "trainer.lr=0.1"


def test_a_finished_run_without_a_checkpoint_is_not_trained_again(tmp_path: Path) -> None:
    """Older versions left no checkpoint at the end: a resubmission would start over from step 0 on top of the
    run's own weights. Refused, pointing to trainer.init_from."""
    run_dir = RunDir(tmp_path)
    write_config(composed(), run_dir)
    run_dir.model_final.write_bytes(b"weights")
    with pytest.raises(ConfigError, match=r"finished run with no checkpoint.*HINT: .*trainer\.init_from="):
        write_config(composed("trainer.max_steps=50"), run_dir)
    run_dir.checkpoint(10).parent.mkdir(parents=True)
    run_dir.checkpoint(10).write_bytes(b"state")
    write_config(composed("trainer.max_steps=50"), run_dir)


def test_checks_change_no_value_and_resolve_fills_in_a_copy() -> None:
    """A config's checks mutate nothing: cluster.tasks_per_node=0 ("one task per GPU") stays 0 in the schema
    Hydra starts from, so a profile's gpus_per_node picks the task count; ``resolve`` (at load) fills it in."""
    cluster = ClusterConfig(launcher="slurm", gpus_per_node=4)
    assert (cluster.tasks_per_node, cluster.ranks_per_node, cluster.world_size) == (0, 4, 4)
    cfg = Config(cluster=cluster, model=MLPConfig(), optim=AdamWConfig())
    assert resolve(cfg).cluster.tasks_per_node == 4 and cfg.cluster.tasks_per_node == 0
    assert resolve(resolve(cfg)) == resolve(cfg)
    assert OmegaConf.structured(Config).cluster.tasks_per_node == 0  # what register_configs stores, as declared
    raw = OmegaConf.to_container(OmegaConf.structured(cfg))
    assert isinstance(raw, dict)
    before = copy.deepcopy(raw)
    assert config_from_dict(raw).cluster.tasks_per_node == 4 and raw == before
    assert composed("cluster=slurm", "cluster.gpus_per_node=4").cluster.tasks_per_node == 4
    assert composed("cluster=slurm").cluster.tasks_per_node == 1


def test_a_saved_config_loads_without_its_script_but_submission_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a saved config.yaml (every rank, the supervisor, `jobs status`) looks at no file: a finished run
    whose script.command is no longer on PATH, or whose script.path was deleted, still loads. Submitting the same
    config is refused, naming the key, the value and the fix."""
    from hpc_train.launch.preflight import check_paths

    bin_dir, script = tmp_path / "bin", tmp_path / "train.py"
    bin_dir.mkdir()
    (bin_dir / "my-trainer").write_text("#!/bin/sh\n")
    (bin_dir / "my-trainer").chmod(0o755)
    script.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    by_command, by_path = RunDir(tmp_path / "by_command"), RunDir(tmp_path / "by_path")
    for run_dir, override in [(by_command, "script.command=my-trainer"), (by_path, f"script.path={script}")]:
        run_dir.path.mkdir()
        write_config(composed(override), run_dir)

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # the executable is gone from PATH, the script deleted
    script.unlink()
    for run_dir in (by_command, by_path):
        saved = run_dir.config.read_text()
        assert load_config(run_dir.config).cluster.world_size == 2  # what `jobs status` reads
        assert run_dir.config.read_text() == saved
    assert load_config(by_path.config).script.path == str(script.resolve())

    with pytest.raises(
        ConfigError,
        match=r"^script\.command='my-trainer' is invalid: not an executable on PATH .*HINT: install it into this",
    ):
        check_paths(load_config(by_command.config))
    with pytest.raises(
        ConfigError,
        match=rf"^script\.path={re.escape(repr(str(script.resolve())))} is invalid: no such file\. HINT: give the path",
    ):
        check_paths(load_config(by_path.config))
    with pytest.raises(ConfigError, match=r"^script\.command='my-trainer' is invalid: not an executable on PATH"):
        composed("script.command=my-trainer")  # as `python -m hpc_train` would check it before submitting


def test_a_wrapper_in_cluster_python_is_refused_where_the_files_are_seen(tmp_path: Path) -> None:
    """A cluster.python with a space is one file (a path such as /home/J Doe/...) or a wrapper. Submission looks
    at the file; a config read elsewhere goes by the spelling (a path has a slash), so it loads anywhere."""
    from hpc_train.config import hydra_quoted

    python = tmp_path / "J Doe" / "python"
    python.parent.mkdir()
    python.touch()
    assert composed("cluster=slurm", f"cluster.python={hydra_quoted(str(python))}").cluster.python == str(python)
    wrapper = "apptainer exec --nv /images/img.sif python"
    with pytest.raises(
        ConfigError, match=r"^cluster\.slurm\.python=.*HINT:.*container='apptainer exec --nv /images/img\.sif'"
    ):
        composed("cluster=slurm", f"cluster.python={hydra_quoted(wrapper)}")
    saved = OmegaConf.to_container(OmegaConf.structured(composed("cluster=slurm")))
    assert isinstance(saved, dict)
    saved["cluster"]["python"] = wrapper
    assert config_from_dict(saved).cluster.python == wrapper  # loaded: not this machine's files to judge


def test_a_one_rank_script_may_run_without_the_torchrun_variables() -> None:
    cfg = composed("script.module=pkg.train", "script.torchrun_env=false", "cluster.tasks_per_node=1")
    assert cfg.script.torchrun_env is False and cfg.cluster.world_size == 1
    assert composed("script.module=pkg.train").script.torchrun_env is True
