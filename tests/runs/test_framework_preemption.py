"""Lightning's epoch end, where a checkpoint taken at the last batch would make Lightning 2.x skip the next
epoch on resume: the callback defers that stop by one step. A real local run of 2 ranks, stopped there (the
script signals itself at a chosen step), resumed, and compared bit for bit with an uninterrupted run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import REPO, Background

pytestmark = pytest.mark.slow

SCRIPT = REPO / "hpc_train" / "examples" / "lightning_script.py"


def command(root: Path, *extra: str) -> list[str]:
    args = ",".join(["--out", str(root / "out"), "--steps", "20", "--sleep", "0", *extra])
    argv = ["-m", "hpc_train", "cluster.tasks_per_node=2", f"hydra.run.dir={root / 'run'}", f"script.path={SCRIPT}"]
    return [sys.executable, *argv, f"script.args=[{args}]"]


def run(root: Path, *extra: str) -> None:
    proc = subprocess.run(command(root, *extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_stop_at_the_epochs_last_batch_resumes_into_the_next_epoch_exactly(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    pytest.importorskip("torchdata", reason="from the test extra: pip install -e '.[test]'")
    baseline = Background(command(tmp_path / "baseline"), tmp_path / "baseline", tmp_path / "baseline.out")
    # 2 ranks x 8 samples a batch over 256 samples: 16 steps an epoch. Signalled at step 14, the ranks agree
    # at 16, the epoch's last batch; the callback saves one step later, at the next epoch's first batch.
    run(tmp_path / "stopped", "--signal-at", "14")
    out = tmp_path / "stopped" / "out"
    assert [p.name for p in out.glob("hpc_ckpt_*.ckpt")] == ["hpc_ckpt_17.ckpt"]
    assert not (out / "final.pt").exists()  # the callback ended the script before the line after fit()
    run(tmp_path / "stopped", "--signal-at", "14")
    assert (out / "starts.txt").read_text().split() == ["0", "17"]
    final, expected = (
        torch.load(p / "out" / "final.pt", weights_only=True) for p in (tmp_path / "stopped", baseline.ready())
    )
    assert all(torch.equal(final[k], expected[k]) for k in expected), "the resumed run's weights differ"
