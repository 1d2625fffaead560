"""Signals in a launching process (``hpc_train.core.signals``), and what an interrupt after a submission says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
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


def _blocked_in(pid: int) -> int:
    """The signal mask of process ``pid`` (SigBlk in /proc), as a bit field."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk:"))
    return int(line.split()[1], 16)


def test_a_ctrl_c_while_the_local_controller_starts_is_kept_not_lost(tmp_path: Path) -> None:
    """CI failure: SIGINT was ignored while submitit started its controller, so a Ctrl-C 1.5 s after launch was
    discarded and the run trained to its end. Now it is noted (and served once the launcher follows the ranks),
    the controller started meanwhile has SIGINT blocked (it stays out of a Ctrl-C), and the handler and mask of
    the launcher are as before afterwards."""
    from hpc_train.core.rundir import RunDir
    from hpc_train.launch.local import _quiet_controller

    before = signal.getsignal(signal.SIGINT)
    with _quiet_controller(RunDir(tmp_path)) as interrupted:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)  # this thread: the one that blocks it
        assert interrupted == []  # pending while blocked: not yet noted, not lost
    try:
        assert interrupted == [signal.SIGINT]
        assert _blocked_in(child.pid) & (1 << (signal.SIGINT - 1)), "the controller would get Ctrl-C"
    finally:
        child.kill()
        child.wait()
    assert signal.getsignal(signal.SIGINT) is before
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_rank_lifts_the_block_once_its_handlers_are_in_place() -> None:
    """A rank that inherited the block gets the Ctrl-C that came while it started, at its handler."""
    from hpc_train.runtime.startup import Startup

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)  # pending, as in a rank still importing
        with Startup() as startup:
            assert startup.stop_received == signal.SIGINT
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
