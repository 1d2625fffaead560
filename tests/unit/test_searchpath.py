"""A user's own config folders, searched before hpc_train's: HPC_TRAIN_CONFIG_PATH and ~/.config/hpc_train."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.api import compose_config
from hpc_train.core.searchpath import ENV_VAR, user_config_dirs, user_profile_dir


def test_folders_in_order(tmp_path: Path) -> None:
    own = tmp_path / "xdg" / "hpc_train"
    env = {ENV_VAR: f"{tmp_path / 'a'}:{tmp_path / 'b'}", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert user_config_dirs(env) == [tmp_path / "a", tmp_path / "b"]  # the per-user folder does not exist yet
    own.mkdir(parents=True)
    assert user_config_dirs(env) == [tmp_path / "a", tmp_path / "b", own]
    assert user_profile_dir({"HOME": "/home/u"}) == Path("/home/u/.config/hpc_train")


@pytest.mark.parametrize("base", ["defaults:\n  - slurm\n  - _self_\n", "launcher: slurm\n"])
def test_profile_in_a_user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    """A profile from HPC_TRAIN_CONFIG_PATH composes, from any folder, whether it extends hpc_train's slurm option
    or sets the launcher itself; either way gpus_per_node picks the task count (one task per GPU)."""
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mycluster.yaml").write_text(
        base + "partition: gpu\ngpus_per_node: 4\nsetup: ['module load cuda/12.4']\n"
    )
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    cfg = compose_config("cluster=mycluster")
    assert (cfg.cluster.launcher, cfg.cluster.partition, cfg.cluster.gpus_per_node) == ("slurm", "gpu", 4)
    assert cfg.cluster.tasks_per_node == 4 and cfg.cluster.setup == ["module load cuda/12.4"]
