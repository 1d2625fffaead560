"""hpc_train.dist, the old name of hpc_train.distributed, gives the very same module objects in every import form.

Each order runs in a fresh interpreter, so a module imported earlier by this test session cannot hide a copy.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

ALIAS_FIRST = """
import sys
import hpc_train.dist
from hpc_train.dist import DistEnv, resolve_environment
from hpc_train.dist import format_rank_table
from hpc_train.dist.env import DistEnv as EnvDistEnv
import hpc_train.dist.process_group
from hpc_train.dist import table
import hpc_train.distributed as d
import hpc_train.distributed.env as e
import hpc_train.distributed.process_group as p
import hpc_train.distributed.table as t
assert hpc_train.dist is d and sys.modules["hpc_train.dist"] is d
assert DistEnv is d.DistEnv and resolve_environment is d.resolve_environment
assert format_rank_table is t.format_rank_table
assert EnvDistEnv is e.DistEnv and sys.modules["hpc_train.dist.env"] is e
assert hpc_train.dist.process_group is p and sys.modules["hpc_train.dist.process_group"] is p
assert p.__spec__.name == "hpc_train.distributed.process_group", p.__spec__
assert table is t
"""
"""Every import form through the old name first (package, names, a lazy name, submodules), then the real one."""

REAL_FIRST = """
import hpc_train.distributed.table as t
import hpc_train.dist.table as a
assert a is t
"""
"""A submodule imported under its real name first, then through the alias: no second copy."""


@pytest.mark.parametrize("code", [ALIAS_FIRST, REAL_FIRST], ids=["alias first", "real name first"])
def test_the_alias_gives_the_same_modules(code: str) -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_importing_the_alias_does_not_import_torch() -> None:
    code = "import sys\nimport hpc_train.dist.env\nprint('torch' in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "False"), proc.stderr


def test_a_missing_submodule_is_still_missing() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import hpc_train.dist.nope"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "No module named 'hpc_train.dist.nope'" in proc.stderr, proc.stderr
