"""The framework integrations: the resume helper on folders, and the import error that names the extra. The
checks against the real frameworks are in tests/runs/test_framework_integrations.py; the callbacks run for real
in tests/runs/test_framework_preemption.py and tests/integration/test_frameworks_slurm.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_train.integrations import newest


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_newest_takes_the_highest_step_that_is_complete(tmp_path: Path) -> None:
    assert newest(tmp_path / "missing", r"checkpoint-(\d+)") is None
    for step in (5, 40, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-40" / "done").touch()
    (tmp_path / "checkpoint-7.tmp").mkdir()
    assert newest(tmp_path, r"checkpoint-(\d+)") == str(tmp_path / "checkpoint-100")  # numbers, not names
    assert newest(tmp_path, r"checkpoint-(\d+)", "done") == str(tmp_path / "checkpoint-40")
    assert newest(tmp_path, r"other-(\d+)") is None


@pytest.mark.parametrize(("module", "framework"), [("transformers", "transformers"), ("lightning", "lightning")])
def test_a_missing_framework_names_the_extra_to_install(module: str, framework: str) -> None:
    proc = python(f"""
        import sys
        sys.modules[{framework!r}] = None  # as if it were not installed
        import hpc_train.integrations.{module}
    """)
    assert proc.returncode == 1
    assert f"pip install 'hpc-train[{framework}]'" in proc.stderr, proc.stderr[-2000:]
