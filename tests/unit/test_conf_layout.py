"""hpc_train's config groups live in one place, the top-level conf/; in a checkout the package reads them there.

The wheel ships conf/ as hpc_train/conf (pyproject.toml; tests/runs/test_wheel.py checks the built wheel).
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

from ..conftest import CONF, REPO


def test_the_package_reads_the_top_level_conf() -> None:
    import hpc_train
    import hpc_train.conf

    assert Path(str(files("hpc_train.conf"))).resolve() == CONF.resolve()
    assert hpc_train.conf.__file__ == str((CONF / "__init__.py").resolve()) and hpc_train.conf.__path__ == [str(CONF)]
    assert sys.modules["hpc_train.conf"] is hpc_train.conf
    assert (files("hpc_train.conf") / "cluster" / "local.yaml").is_file()


def test_one_copy_of_each_config() -> None:
    """hpc_train/conf/ holds only the module that points an import at conf/: no second copy of a YAML file."""
    beside = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "hpc_train" / "conf").rglob("*") if p.is_file())
    assert [p for p in beside if "__pycache__" not in p] == ["hpc_train/conf/__init__.py"]
    assert not list((REPO / "hpc_train").rglob("*.yaml"))
    assert (CONF / "config.yaml").is_file()


def test_hydra_composes_from_the_top_level_conf() -> None:
    from hydra import compose, initialize_config_module

    from hpc_train.config import register_configs

    register_configs()
    with initialize_config_module(config_module="hpc_train.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["optim=sgd"])
    assert cfg.optim.name == "sgd"
