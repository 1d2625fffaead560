"""Signals in a launching process (``hpc_train.core.signals``), and what an interrupt after a submission says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.core.signals import held, sigterm_as_interrupt


def test_a_signal_in_a_held_block_acts_when_it_ends() -> None:
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # twice: it still acts once
            reached_the_end = True
        pytest.fail("the held SIGTERM did not act when the block ended")
    assert reached_the_end
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()


def test_children_started_in_a_held_block_hold_the_signals_too() -> None:
    """sbatch, started in the block, is not cut by the terminal's Ctrl-C (it reaches the process group)."""
    probe = (
        "import json, signal; print(json.dumps(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))))"
    )
    with held():
        inside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert {int(signal.SIGINT), int(signal.SIGTERM)} <= set(json.loads(inside)) and json.loads(outside) == []


def test_an_interrupt_after_a_submission_names_the_jobs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hpc_train import __main__ as entry
    from hpc_train.launch import slurm

    monkeypatch.setattr(slurm, "SUBMITTED", [])
    assert "nothing was launched" in entry._interrupted()
    monkeypatch.setattr(slurm, "SUBMITTED", [("4242", tmp_path / "run")])
    said = entry._interrupted()
    assert "job 4242" in said and "go on" in said and f"jobs cancel {tmp_path / 'run'}" in said
    assert "nothing was launched" not in said
