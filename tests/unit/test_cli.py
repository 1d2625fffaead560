"""What a user meets first: `hpc-train --help`, and errors for what Hydra's grammar or Slurm would refuse."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.api import compose_config
from hpc_train.core.errors import ConfigError

HPC_TRAIN = Path(sys.executable).parent / "hpc-train"  # the console script pip installed beside this Python


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HPC_TRAIN), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_help_names_the_program_and_only_real_options(tmp_path: Path) -> None:
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "mycluster.yaml").write_text("launcher: slurm\n")
    (tmp_path / "conf" / "experiment").mkdir()
    (tmp_path / "conf" / "experiment" / "quick.yaml").write_text("# @package _global_\n")
    proc = run("--help", "--config-dir", "conf", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: hpc-train") and "python -m hpc_train" in proc.stdout
    assert "__main__" not in proc.stdout and "schema_" not in proc.stdout
    assert "cluster  debug, local, mycluster, slurm" in proc.stdout
    assert "model    cnn, custom, mlp, transformer" in proc.stdout
    assert "+experiment quick" in proc.stdout  # a group of the user's own, picked with +experiment=quick


def test_console_script_composes_from_any_folder(tmp_path: Path) -> None:
    proc = run("--cfg", "job", "trainer.max_steps=7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "max_steps: 7" in proc.stdout and "launcher: local" in proc.stdout


def test_unquoted_hostlist_gets_the_quoted_form(tmp_path: Path) -> None:
    proc = run("cluster=slurm", "cluster.exclude=node[07-08]", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 2
    assert """HINT: write 'cluster.exclude="node[07-08]"'""" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(ConfigError, match=r"brackets start a list"):
        compose_config("cluster=slurm", "cluster.exclude=node[07-08]")
    assert compose_config("cluster=slurm", 'cluster.exclude="node[07-08]"').cluster.exclude == "node[07-08]"


@pytest.mark.parametrize(("value", "reason"), [("node[3-1]", "start > stop"), ("node[1-2", "unbalanced brackets")])
def test_invalid_hostlist_is_refused_with_the_reason(value: str, reason: str) -> None:
    expected = rf"cluster\.exclude={re.escape(repr(value))} is invalid: not a Slurm hostlist \({reason}\)"
    with pytest.raises(ConfigError, match=expected):
        compose_config("cluster=slurm", f'cluster.exclude="{value}"')
