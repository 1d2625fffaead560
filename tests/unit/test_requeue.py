"""Requeue decisions, the signal flag and the preflight's error, without a cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.errors import DistEnvironmentError
from hpc_train.core.identity import JobIdentity
from hpc_train.core.records import RequeueEntry
from hpc_train.core.rundir import RunDir
from hpc_train.distributed import DistEnv
from hpc_train.distributed.process_group import init_distributed
from hpc_train.runtime.requeue import refusal, requeue_target
from hpc_train.train.stopping import StopSignals, signal_number


def attempt(resumed: int, stopped: int) -> RequeueEntry:
    return RequeueEntry(attempt=0, resumed_step=resumed, stopped_step=stopped, signal=12)


def test_requeue_target_is_array_aware() -> None:
    assert requeue_target({"SLURM_JOB_ID": "107"}) == "107"
    assert requeue_target({"SLURM_JOB_ID": "108", "SLURM_ARRAY_JOB_ID": "107", "SLURM_ARRAY_TASK_ID": "1"}) == "107_1"
    assert requeue_target({}) is None


def test_restart_count_prefers_slurm(tmp_path: Path) -> None:
    assert JobIdentity.from_environ({"SLURM_RESTART_COUNT": "2"}, launched=5).attempt == 2
    assert JobIdentity.from_environ({}, launched=1).attempt == 1 and JobIdentity.from_environ({}).attempt == 0
    rd = RunDir(tmp_path)
    assert rd.next_attempt() == 0  # a fresh run dir
    rd.logs.mkdir()
    rd.rank_log(0, 0).touch()
    rd.rank_log(0, 1).touch()
    assert rd.next_attempt() == 2  # the local launcher counts the attempts whose rank 0 logs are there


def test_the_next_attempt_number_is_one_more_than_any_before_it() -> None:
    """JobIdentity.next_attempt is the one place the number is worked out: from the attempts that left a rank 0
    log and the supervisor's records, whichever says more (a record lost, a log purged, numbers with a gap)."""
    assert JobIdentity.next_attempt(0) == 0
    assert JobIdentity.next_attempt(2) == 2
    assert JobIdentity.next_attempt(1, [0, 1, 2]) == 3
    assert JobIdentity.next_attempt(5, [0, 1]) == 5
    assert JobIdentity.next_attempt(0, [4]) == 5  # a gap: one more than the highest, never a number used before
    assert not JobIdentity.ran_before(1, this_one_logged=True) and JobIdentity.ran_before(1, this_one_logged=False)
    assert JobIdentity.ran_before(2, this_one_logged=True)


def test_refusal_counts_restarts_and_stalls() -> None:
    cluster = ClusterConfig(launcher="slurm", max_restarts=3, max_stalled_restarts=1)
    assert refusal([attempt(0, 40)], 0, cluster) is None
    assert "already restarted 3 times (cluster.slurm.max_restarts=3)" in str(refusal([attempt(0, 40)], 3, cluster))
    # One attempt without progress is tolerated, two in a row are not.
    assert refusal([attempt(0, 40), attempt(40, 40)], 1, cluster) is None
    why = refusal([attempt(0, 40), attempt(40, 40), attempt(40, 40)], 2, cluster)
    assert why is not None and "stuck at step 40" in why and "HINT" in why


def test_signal_handler_only_records_the_first_signal() -> None:
    stop = StopSignals([signal_number("usr2"), signal.SIGTERM]).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGUSR2
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def test_preflight_names_the_missing_ranks() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = DistEnv(
        rank=0,
        local_rank=0,
        world_size=3,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=port,
        source="single",
        hostname=socket.gethostname(),
    )
    import torch

    with pytest.raises(DistEnvironmentError, match=r"only ranks 0 of 3 .*127\.0\.0\.1:\d+; missing: ranks 1,2"):
        init_distributed(env, torch.device("cpu"), timedelta(seconds=30), timedelta(seconds=1))


def test_unknown_progress_is_not_a_stall() -> None:
    """A user's script that does not report its steps: only cluster.max_restarts limits its requeues."""
    cluster = ClusterConfig(launcher="slurm", max_restarts=5, max_stalled_restarts=0)
    unknown = RequeueEntry(attempt=0, resumed_step=None, stopped_step=None, signal=12)
    assert refusal([unknown, unknown, unknown], 3, cluster) is None
    assert "max_restarts=5" in str(refusal([unknown], 5, cluster))


def test_should_stop_outside_a_process_group_and_the_restart_count() -> None:
    """In a script's own process: the handler only sets the flag, should_stop reports it, the count comes from
    the worker (a subprocess: importing the module installs signal handlers)."""
    code = (
        "import os, signal\n"
        "from hpc_train import preemption\n"
        "first = preemption.should_stop()\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print(first, preemption.should_stop(), preemption.stop_signal(), preemption.restart_count())\n"
    )
    env = {**os.environ, "HPC_TRAIN_ATTEMPT": "3"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["False", "True", str(int(signal.SIGUSR2)), "3"], proc.stderr


def test_each_stop_keeps_its_seconds_to_a_durable_checkpoint(tmp_path: Path) -> None:
    from hpc_train.launch.state import stops_note
    from hpc_train.runtime.requeue import record_attempt

    rd = RunDir(tmp_path)
    record_attempt(rd, 0, 0, 40, signal.SIGUSR2, 0.4321)
    history = record_attempt(rd, 1, 40, 80, signal.SIGUSR2)  # a rank that did not catch the signal itself
    assert [e.stop_saved_s for e in rd.requeue_records()] == [0.432, None] == [e.stop_saved_s for e in history]
    assert stops_note(history) == ["requeued 2x; checkpoint durable 0.4 s after each stop signal"]
    assert stops_note([attempt(0, 40)]) == []


def test_the_stop_handler_notes_when_the_signal_came() -> None:
    stop = StopSignals([signal.SIGUSR1]).install()
    try:
        assert stop.received_at is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == signal.SIGUSR1 and stop.received_at is not None
    finally:
        stop.restore()
