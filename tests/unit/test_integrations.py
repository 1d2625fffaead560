"""The framework integrations' resume helpers and import errors (the callbacks themselves run for real in
tests/runs/test_framework_preemption.py and tests/integration/test_frameworks_slurm.py).

Importing an integration installs hpc_train's stop-signal handlers in that process, so each check runs in a
child interpreter rather than in pytest's own.
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


def test_transformers_last_checkpoint_skips_a_half_written_one(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="from the test extra: pip install -e '.[test]'")
    for step, files in {10: ["trainer_state.json"], 20: ["trainer_state.json", "hpc_train_complete"], 30: []}.items():
        (tmp_path / "a" / f"checkpoint-{step}").mkdir(parents=True)
        for name in files:
            (tmp_path / "a" / f"checkpoint-{step}" / name).touch()
    (tmp_path / "b" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "b" / "checkpoint-3" / "trainer_state.json").touch()  # a run without the callback
    (tmp_path / "b" / "checkpoint-4").mkdir()
    proc = python(f"""
        from hpc_train.integrations.transformers import last_checkpoint
        print(last_checkpoint({str(tmp_path / "a")!r}), last_checkpoint({str(tmp_path / "b")!r}),
              last_checkpoint({str(tmp_path / "c")!r}))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "a" / "checkpoint-20"), str(tmp_path / "b" / "checkpoint-3"), "None"]


def test_lightning_last_checkpoint_ignores_a_save_in_progress(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    for name in ("hpc_ckpt_9.ckpt", "hpc_ckpt_12.ckpt", ".hpc_train_saving_15", "epoch=3.ckpt"):
        (tmp_path / name).touch()
    proc = python(f"""
        from hpc_train.integrations.lightning import last_checkpoint
        print(last_checkpoint({str(tmp_path)!r}))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "hpc_ckpt_12.ckpt")


@pytest.mark.parametrize(("module", "framework"), [("transformers", "transformers"), ("lightning", "lightning")])
def test_a_missing_framework_names_the_extra_to_install(module: str, framework: str) -> None:
    proc = python(f"""
        import sys
        sys.modules[{framework!r}] = None  # as if it were not installed
        import hpc_train.integrations.{module}
    """)
    assert proc.returncode == 1
    assert f"pip install 'hpc-train[{framework}]'" in proc.stderr, proc.stderr[-2000:]
