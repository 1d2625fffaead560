"""The framework integrations: the resume helper on folders, and the import error that names the extra. The
checks against the real frameworks are in tests/runs/test_framework_integrations.py; the callbacks run for real
in tests/runs/test_framework_preemption.py and tests/integration/test_frameworks_slurm.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


@pytest.fixture
def lightning() -> Any:
    """hpc_train.integrations.lightning, imported here; its import installs hpc_train.preemption's stop handlers
    in this process (as it must in a user's script), which other tests expect at their defaults: put back."""
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    saved = {sig: signal.getsignal(sig) for sig in stops}
    module = pytest.importorskip("hpc_train.integrations.lightning", reason="from the test extra")
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    return module


def test_the_resumed_epoch_skips_its_trained_batches_once_in_the_epochs_order(lightning: Any) -> None:
    import torch
    from torch.utils.data import DistributedSampler, TensorDataset

    sampler = DistributedSampler(TensorDataset(torch.arange(20)), num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(2)
    whole = list(sampler)
    skipping = lightning._SkipFirst(sampler, 4)
    skipping.set_epoch(2)  # the sampler's own methods go through
    assert len(skipping) == len(sampler) == 10  # Lightning counts the epoch whole
    assert list(skipping) == whole[4:]  # the epoch's own order, from its 5th item
    assert list(skipping) == whole  # once: the next epoch is whole


def test_every_random_state_comes_back_from_a_weights_only_checkpoint(tmp_path: Path, lightning: Any) -> None:
    import random

    import numpy as np
    import torch

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save({"random": [lightning._random_state()]}, tmp_path / "state.pt")
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    lightning._set_random_state(torch.load(tmp_path / "state.pt", weights_only=True)["random"][0])
    again = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(expected[0], again[0]) and (expected[1] == again[1]).all() and expected[2] == again[2]
