"""Lightning's epoch end, where a checkpoint taken at the last batch would make Lightning 2.x skip the next
epoch on resume: the callback defers that stop by one step. A real local run of 2 ranks, stopped there (the
script signals itself at a chosen step), resumed, and compared bit for bit with an uninterrupted run.

The uninterrupted runs are the README's Lightning and scvi-tools examples, whole (test_readme leaves them here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import Background
from ..readme_examples import cli_examples
from .test_readme import LIGHTNING_EXAMPLE, SCVI_EXAMPLE

pytestmark = pytest.mark.slow


def readme_command(example: str, root: Path, *extra: str) -> list[str]:
    """The README's example that names ``example``, as it is written, with its output in ``root`` (and ``extra``
    arguments for its script)."""
    readme = next(args for args in cli_examples() if example in args)
    overrides = [a for a in readme if not a.startswith("script.args=")]
    (given,) = [a.removeprefix("script.args=[").removesuffix("]") for a in readme if a.startswith("script.args=")]
    words = given.split(",")
    if "--out" in words:  # the README's own output folder gives way to root/out
        del words[words.index("--out") : words.index("--out") + 2]
    args = ",".join(["--out", str(root / "out"), *words, *extra])
    return [sys.executable, "-m", "hpc_train", f"hydra.run.dir={root / 'run'}", *overrides, f"script.args=[{args}]"]


def command(root: Path, *extra: str) -> list[str]:
    """The README's Lightning example (2 ranks, 20 steps), in ``root``."""
    return readme_command(LIGHTNING_EXAMPLE, root, *extra)


def run(root: Path, *extra: str) -> None:
    proc = subprocess.run(command(root, *extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_stop_at_the_epochs_last_batch_resumes_into_the_next_epoch_exactly(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="from the test extra: pip install -e '.[test]'")
    pytest.importorskip("torchdata", reason="from the test extra: pip install -e '.[test]'")
    baseline = Background(command(tmp_path / "baseline"), tmp_path / "baseline", tmp_path / "baseline.out")
    # The steps below hold for the README's example as it is: 20 steps on the local default of 2 ranks.
    assert "--steps,20" in command(tmp_path)[-1] and "cluster.tasks_per_node" not in " ".join(command(tmp_path))
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
    # The README's example itself: it ran to the end, as the README says.
    assert "hpc_train: all 2 ranks completed" in baseline.log.read_text()


def scvi_command(root: Path, *extra: str) -> list[str]:
    return readme_command(SCVI_EXAMPLE, root, *extra)


def test_scvi_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """scvi-tools' SCVI through its own train(), on 2 ranks: its AnnDataLoader is a plain DataLoader, not a
    resumable one, and its model draws latent noise from the global RNG. Stopped in the middle of an epoch and
    resumed, it ends with the uninterrupted run's weights, bit for bit, and model.history has every epoch. The
    uninterrupted run is the README's example, whole (test_readme leaves it to this test)."""
    pytest.importorskip("scvi", reason="from the test extra: pip install -e '.[test]'")
    baseline = Background(scvi_command(tmp_path / "baseline"), tmp_path / "baseline", tmp_path / "baseline.out")
    # 576 training cells over 2 ranks in batches of 32: 9 steps an epoch. Signalled at step 13, the ranks agree
    # at 15: the 6th batch of the second epoch, so 3 batches of that epoch are left for the resumed run.
    first = subprocess.run(
        scvi_command(tmp_path / "stopped", "--signal-at", "13"), capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "stopped" / "out"
    assert [p.name for p in out.glob("hpc_ckpt_*.ckpt")] == ["hpc_ckpt_15.ckpt"]
    assert not (out / "final.pt").exists()  # the callback ended the script before the line after train()
    # scvi prints every exception out of fit(), the callback's exit included: the line says what happened.
    assert "hpc_train: stopped on a signal at step 15, saved" in first.stdout + first.stderr
    run_scvi = subprocess.run(
        scvi_command(tmp_path / "stopped", "--signal-at", "13"), capture_output=True, text=True, timeout=600
    )
    assert run_scvi.returncode == 0, run_scvi.stderr[-3000:]
    assert (out / "starts.txt").read_text().split() == ["0", "15"]
    final, expected = (
        torch.load(p / "out" / "final.pt", weights_only=True) for p in (tmp_path / "stopped", baseline.ready())
    )
    difference = max((final[k].double() - expected[k].double()).abs().max().item() for k in expected)
    assert difference == 0.0, f"the resumed SCVI model is {difference:.3g} away from the uninterrupted one"
    history, whole = (
        json.loads((p / "out" / "history.json").read_text()) for p in (tmp_path / "stopped", tmp_path / "baseline")
    )
    assert len(history["elbo_train"]) == len(whole["elbo_train"]) == 4, history
    # Epoch 1 was split by the stop: its logged mean covers only the batches after the resume.
    assert [history["elbo_train"][e] for e in (0, 2, 3)] == [whole["elbo_train"][e] for e in (0, 2, 3)]
