"""Values read from the environment (``${oc.env:...}``) end up in the run's files: the run dir is made private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from hpc_train.config import CONFIG_MODULE, config_from_dict, environment_keys, register_configs
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config


def _raw(*overrides: str, config_dir: Path | None = None):  # type: ignore[no-untyped-def]
    register_configs()
    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir else []
    with initialize_config_module(config_module=CONFIG_MODULE.removeprefix("pkg://"), version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, *extra])


def test_a_profile_that_reads_a_token_from_the_environment_makes_the_run_dir_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shared profile puts a tracker token into the job's setup: it must not be world-readable on disk."""
    monkeypatch.setenv("TRACKER_TOKEN", "s3cret-token")
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "team.yaml").write_text(
        "defaults:\n  - local\n  - _self_\nsetup:\n  - export TRACKER_TOKEN=${oc.env:TRACKER_TOKEN}\n"
    )
    raw = _raw("cluster=team", config_dir=tmp_path / "conf")
    assert environment_keys(raw) == ["cluster.setup.0"]
    run = RunDir(tmp_path / "run")
    run.path.mkdir(mode=0o755)
    write_config(config_from_dict(raw), run, [], secret_keys=environment_keys(raw))
    assert "s3cret-token" in run.config.read_text()  # resolved: the ranks need the value
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    assert "readable by you alone (0700)" in capsys.readouterr().out


def test_a_config_without_environment_values_keeps_its_permissions(tmp_path: Path) -> None:
    raw = _raw("trainer.max_steps=5")
    assert environment_keys(raw) == []
    run = RunDir(tmp_path / "run")
    run.path.mkdir(mode=0o755)
    write_config(config_from_dict(raw), run, [], secret_keys=environment_keys(raw))
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o755


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_checkpoints_entry_that_is_no_folder_is_refused_before_launch(tmp_path: Path, kind: str) -> None:
    from hpc_train.core.errors import ConfigError

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    if kind == "file":
        run.checkpoints.write_text("")
    else:
        run.checkpoints.symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=f"checkpoints is a {'file' if kind == 'file' else 'link to nothing'}"):
        write_config(config_from_dict(_raw("trainer.max_steps=5")), run, [])
    assert not run.config.exists()
