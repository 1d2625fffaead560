"""In-allocation restart, piece by piece: failure classes, node choice, the srun command and the goodput ledger.

The whole of it runs on the real testbed in tests/integration/test_recovery_slurm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.errors import ConfigError
from hpc_train.core.goodput import ledger
from hpc_train.core.rundir import RunDir
from hpc_train.launch.sbatch import sbatch_flags
from hpc_train.runtime.failures import SrunReport, classify
from hpc_train.runtime.supervisor import _made_progress, pick_nodes, step_argv
from hpc_train.train.watchdog import FROZEN

SRUN_KILL = [
    "srun: error: node2: task 2: Killed\n",
    "srun: launch/slurm: _step_signal: Terminating StepId=1208.0\n",
    "srun: error: node1: tasks 0-1: Terminated\n",
    "srun: error: node2: task 3: Exited with exit code 1\n",
]


def running(rank: int, host: str, step: int = 40) -> dict[str, object]:
    return {"rank": rank, "state": "running", "host": host, "step": step, "time": 1.0}


def failed(rank: int, host: str, error: str, step: int = 40, traceback: str = "", t: float = 2.0) -> dict[str, object]:
    return {
        "rank": rank,
        "state": "failed",
        "host": host,
        "error": error,
        "traceback": traceback,
        "step": step,
        "time": t,
    }


def slurm(**kw: object) -> ClusterConfig:
    return ClusterConfig(launcher="slurm", **kw)  # type: ignore[arg-type]


def test_srun_lines_parse_in_order() -> None:
    report = SrunReport.parse([*SRUN_KILL, "srun: Job 5 step creation temporarily disabled, retrying\n"])
    assert report.task_exits == [
        ("node2", 2, "Killed"),
        ("node1", 0, "Terminated"),
        ("node2", 3, "Exited with exit code 1"),
    ]
    assert report.lost_nodes == []
    assert SrunReport.parse(["srun: error: Node failure on node3\n"]).lost_nodes == ["node3"]


def test_a_killed_rank_is_the_cause_not_the_peers_it_took_down() -> None:
    statuses = {
        0: failed(0, "node1", "DistBackendError: [gloo] Connection closed by peer"),
        1: running(1, "node1"),
        2: running(2, "node2"),
        3: failed(3, "node2", "RuntimeError: Connection reset by peer"),
    }
    failure = classify(statuses, SrunReport.parse(SRUN_KILL), 137)
    assert (failure.kind, failure.rank, failure.host, failure.suspects) == ("killed", 2, "node2", ("node2",))
    assert failure.retryable


@pytest.mark.parametrize(
    ("error", "traceback", "kind", "retryable"),
    [
        ("DistBackendError: gloo timed out", "", "collective", True),
        ("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer", "", "collective", True),
        ("watchdog: no progress for 12s (trainer.watchdog_s=10) while training", "", "hang", True),
        ("RuntimeError: injected fault", "", "exception", True),
        ("ModuleNotFoundError: No module named 'mymodel'", "", "import", False),
        ("ConfigError: trainer.lr=-1: must be positive", "", "config", False),
        (
            "ScriptError: train.py exited with status 1 on rank 1: ValueError: bad",
            "Traceback\nValueError: bad",
            "exception",
            True,
        ),
        (
            "ScriptError: train.py exited with status 1 on rank 1",
            "x\nImportError: cannot import name 'f'",
            "import",
            False,
        ),
        ("ScriptError: train.py was killed by SIGKILL on rank 1", "", "killed", True),
    ],
)
def test_reported_errors_are_classed(error: str, traceback: str, kind: str, retryable: bool) -> None:
    statuses = {0: running(0, "node1"), 1: failed(1, "node1", error, traceback=traceback)}
    failure = classify(statuses, SrunReport.parse(["srun: error: node1: task 1: Exited with exit code 1\n"]), 1)
    assert (failure.kind, failure.retryable, failure.rank) == (kind, retryable, 1)


def test_the_same_exception_at_the_same_step_twice_is_fatal() -> None:
    exit_line = ["srun: error: node1: task 1: Exited with exit code 1\n"]
    statuses = {1: failed(1, "node1", "RuntimeError: boom", step=12) | {"failed_step": 13}}
    first = classify(statuses, SrunReport.parse(exit_line), 1)
    assert first.kind == "exception" and first.step == 13
    again = classify(statuses, SrunReport.parse(exit_line), 1, previous=first.as_dict())
    assert again.kind == "repeated_exception" and not again.retryable
    elsewhere = {1: failed(1, "node1", "RuntimeError: boom") | {"failed_step": 14}}
    assert classify(elsewhere, SrunReport.parse(exit_line), 1, previous=first.as_dict()).kind == "exception"


def test_a_hang_blames_the_node_of_the_silent_rank() -> None:
    statuses = {
        0: failed(0, "node1", "watchdog: no progress for 11s"),
        1: failed(1, "node1", "watchdog: no progress for 11s"),
        2: failed(2, "node2", "watchdog: no progress for 11s"),
        3: running(3, "node2"),
    }
    exits = SrunReport.parse(["srun: error: node1: task 0: Exited with exit code 75\n"])
    assert (classify(statuses, exits, 75).kind, classify(statuses, exits, 75).suspects) == ("hang", ("node2",))
    # Woken by srun's SIGCONT, the frozen rank's own watchdog fires too, and says it was not running.
    statuses[3] = failed(3, "node2", f"watchdog: no progress for 40s. {FROZEN} for 31s")
    assert classify(statuses, exits, 75).suspects == ("node2",)
    statuses[3] = failed(3, "node2", "watchdog: no progress for 40s")
    assert classify(statuses, exits, 75).suspects == ()  # nobody to blame: no node is left out


def test_a_lost_node_or_a_silent_step() -> None:
    lost = classify({}, SrunReport.parse(["srun: error: Node failure on node2\n"]), 1)
    assert (lost.kind, lost.suspects, lost.retryable) == ("node_lost", ("node2",), True)
    silent = classify({0: running(0, "node1")}, SrunReport([], []), 137)
    assert (silent.kind, silent.suspects) == ("killed", ("node1",))
    assert classify({}, SrunReport([], []), 1).kind == "unknown"


def test_nodes_skip_the_bad_ones_only_with_spares() -> None:
    allocation = ["node1", "node2", "node3"]
    assert pick_nodes(allocation, ["node2"], slurm(nodes=2, spare_nodes=1)) == ["node1", "node3"]
    assert pick_nodes(allocation[:2], ["node2"], slurm(nodes=2)) == ["node1", "node2"]
    why = pick_nodes(allocation, ["node2", "node3"], slurm(nodes=2, spare_nodes=1))
    assert isinstance(why, str) and "no healthy node left" in why and "node2,node3" in why


def test_the_step_command_is_an_argv_with_the_users_srun_args_last() -> None:
    cluster = slurm(nodes=2, tasks_per_node=2, cpus_per_task=3, srun_args=["--comment=$(touch x); rm -rf ~"])
    argv = step_argv(RunDir(Path("/r un")), cluster, ["node1", "node3"], "/py")
    assert argv[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=3",
        "--nodelist=node1,node3",
    ]
    assert argv.index("--comment=$(touch x); rm -rf ~") < argv.index("/py")
    assert argv[-6:] == ["/py", "-u", "-m", "hpc_train.worker", "--run-dir", "/r un"]


def test_spare_nodes_are_asked_for_and_checked() -> None:
    assert sbatch_flags(slurm(nodes=2, spare_nodes=1))["nodes"] == "3"
    with pytest.raises(ConfigError, match="spare_nodes"):
        slurm(spare_nodes=-1)


def test_progress_is_a_newer_checkpoint() -> None:
    assert _made_progress({"progress": {"first_step": 31, "checkpoint_step": 40}})
    assert not _made_progress({"progress": {"first_step": 41, "step": 45}})
    assert _made_progress({"script": True, "progress": {"first_step": 41, "step": 45}})
    assert not _made_progress({"progress": {}})


def test_ledger_of_a_restart_in_the_allocation() -> None:
    """Allocation 0..100 s. Attempt 0: starts at 1, first step done at 11 (1 s steps), checkpoint of step 30
    at 40, killed after step 35 (at 45), srun gone at 47. Attempt 1 starts at 48, resumes from 30, first step
    (31) at 56, completes step 70 at 95."""
    allocations = [{"job_id": "7", "start": 0.0, "end": 100.0}]
    attempts = [
        {
            "attempt": 0,
            "job_id": "7",
            "start": 1.0,
            "end": 47.0,
            "outcome": "failed",
            "failure": {"kind": "killed"},
            "progress": {
                "first_step": 1,
                "first_time": 11.0,
                "step": 35,
                "time": 45.0,
                "checkpoint_step": 30,
                "checkpoint_time": 40.0,
            },
        },
        {
            "attempt": 1,
            "job_id": "7",
            "start": 48.0,
            "end": 96.0,
            "outcome": "completed",
            "progress": {"first_step": 31, "first_time": 56.0, "step": 70, "time": 95.0},
        },
    ]
    book = ledger(allocations, attempts, now=200.0)
    first, second = book["per_attempt"]
    assert (first["kept_step"], first["startup_s"], first["productive_s"], first["redone_s"]) == (30, 9.0, 30.0, 7.0)
    assert (second["kept_step"], second["startup_s"], second["productive_s"]) == (70, 7.0, 40.0)
    assert book["productive_s"] == 70.0 and book["wall_s"] == 100.0 and book["ettr"] == 0.7
    assert book["lost_s"] == 30.0 and book["restart_gaps_s"] == pytest.approx(30.0 - 9 - 7 - 7 - 1)
    assert book["restarts"] == [{"after_attempt": 0, "class": "killed", "in_allocation": True, "latency_s": 11.0}]
    # While the allocation still runs, "now" closes it.
    assert ledger([{"job_id": "7", "start": 0.0, "end": None}], [], now=50.0)["wall_s"] == 50.0
    assert ledger([], [])["ettr"] == 0.0
