"""hpc_train.dist, the old name of hpc_train.distributed, gives the very same module objects in every import form.

Each form runs in a fresh interpreter, so a module imported earlier by this test session cannot hide a copy.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORMS = {
    "import package": (
        "import hpc_train.dist\nimport hpc_train.distributed as d\nassert hpc_train.dist is d\n"
        "assert sys.modules['hpc_train.dist'] is d\n"
    ),
    "from package import name": (
        "from hpc_train.dist import DistEnv, resolve_environment\nimport hpc_train.distributed as d\n"
        "assert DistEnv is d.DistEnv and resolve_environment is d.resolve_environment\n"
    ),
    "from package import lazy name": (
        "from hpc_train.dist import format_rank_table\nimport hpc_train.distributed.table as t\n"
        "assert format_rank_table is t.format_rank_table\n"
    ),
    "from submodule import name": (
        "from hpc_train.dist.env import DistEnv\nimport hpc_train.distributed.env as e\nassert DistEnv is e.DistEnv\n"
        "assert sys.modules['hpc_train.dist.env'] is e\n"
    ),
    "import submodule": (
        "import hpc_train.dist.process_group\nimport hpc_train.distributed.process_group as p\n"
        "assert hpc_train.dist.process_group is p and sys.modules['hpc_train.dist.process_group'] is p\n"
        "assert p.__spec__.name == 'hpc_train.distributed.process_group', p.__spec__\n"
    ),
    "import submodule after the real one": (
        "import hpc_train.distributed.table as t\nimport hpc_train.dist.table as a\nassert a is t\n"
    ),
    "from package import submodule": (
        "from hpc_train.dist import table\nimport hpc_train.distributed.table as t\nassert table is t\n"
    ),
}


@pytest.mark.parametrize("code", FORMS.values(), ids=FORMS.keys())
def test_the_alias_gives_the_same_modules(code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import sys\n" + code], capture_output=True, text=True, timeout=120
    )
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
