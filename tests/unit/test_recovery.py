"""In-allocation restart, piece by piece: failure classes, node choice, the srun command and the goodput ledger.

The whole of it runs on the real testbed in tests/integration/test_recovery_slurm.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.errors import ConfigError
from hpc_train.core.goodput import ledger
from hpc_train.core.records import Allocation, AttemptRecord, RankState, RankStatus
from hpc_train.core.rundir import RunDir
from hpc_train.launch.sbatch import sbatch_flags
from hpc_train.runtime.failures import SrunReport, classify
from hpc_train.runtime.retry import attempt_progressed
from hpc_train.runtime.supervisor import pick_nodes, step_argv
from hpc_train.train.watchdog import FROZEN

SRUN_KILL = [
    "srun: error: node2: task 2: Killed\n",
    "srun: launch/slurm: _step_signal: Terminating StepId=1208.0\n",
    "srun: error: node1: tasks 0-1: Terminated\n",
    "srun: error: node2: task 3: Exited with exit code 1\n",
]


def running(rank: int, host: str, step: int = 40) -> RankStatus:
    return RankStatus(rank=rank, state=RankState.RUNNING, host=host, step=step, time=1.0)


def failed(rank: int, host: str, error: str, step: int = 40, traceback: str = "", t: float = 2.0) -> RankStatus:
    return RankStatus(
        rank=rank,
        state=RankState.FAILED,
        host=host,
        error=error,
        traceback=traceback,
        step=step,
        time=t,
    )


def as_allocations(*records: dict[str, Any]) -> list[Allocation]:
    return [Allocation.from_json(r) for r in records]


def as_attempts(*records: dict[str, Any]) -> list[AttemptRecord]:
    return [AttemptRecord.from_json(r) for r in records]


def with_progress(**progress: object) -> AttemptRecord:
    """A failed attempt that made this progress (a user's script's with ``script=True``)."""
    script = bool(progress.pop("script", False))
    return AttemptRecord.from_json({"attempt": 0, "outcome": "failed", "script": script, "progress": progress})


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
    stopped = replace(running(0, "node1"), state=RankState.STOPPED)  # srun's SIGTERM after rank 1 failed
    statuses = {0: stopped, 1: failed(1, "node1", error, traceback=traceback)}
    failure = classify(statuses, SrunReport.parse(["srun: error: node1: task 1: Exited with exit code 1\n"]), 1)
    assert (failure.kind, failure.retryable, failure.rank) == (kind, retryable, 1)


def test_the_same_exception_at_the_same_step_twice_is_fatal() -> None:
    exit_line = ["srun: error: node1: task 1: Exited with exit code 1\n"]
    statuses = {1: replace(failed(1, "node1", "RuntimeError: boom", step=12), failed_step=13)}
    first = classify(statuses, SrunReport.parse(exit_line), 1)
    assert first.kind == "exception" and first.step == 13
    again = classify(statuses, SrunReport.parse(exit_line), 1, previous=first)
    assert again.kind == "repeated_exception" and not again.retryable
    elsewhere = {1: replace(failed(1, "node1", "RuntimeError: boom"), failed_step=14)}
    assert classify(elsewhere, SrunReport.parse(exit_line), 1, previous=first).kind == "exception"


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


def test_without_a_spare_the_job_goes_on_with_fewer_nodes_down_to_min_nodes() -> None:
    """cluster.min_nodes: the healthy nodes, as many as the global batch splits over, never fewer than it."""
    allocation = ["node1", "node2", "node3", "node4"]
    four = slurm(nodes=4, min_nodes=2)
    assert pick_nodes(allocation, [], four) == allocation
    assert pick_nodes(allocation, ["node2"], four) == ["node1", "node3", "node4"]
    # A global batch that does not split over 3 nodes: on 2 of the 3 healthy ones.
    assert pick_nodes(allocation, ["node2"], four, fits=lambda n: n != 3) == ["node1", "node3"]
    why = pick_nodes(allocation, ["node1", "node2", "node3"], four)
    assert isinstance(why, str) and "needs 2 nodes (cluster.min_nodes=2)" in why and "node1,node2,node3" in why
    # Spares first: a lost node is replaced, and only then does the job shrink.
    spare = slurm(nodes=2, min_nodes=1, spare_nodes=1)
    assert pick_nodes(allocation[:3], ["node1"], spare) == ["node2", "node3"]
    assert pick_nodes(allocation[:3], ["node1", "node3"], spare) == ["node2"]
    assert "no-kill" in sbatch_flags(four) and "no-kill" not in sbatch_flags(slurm(nodes=4))


def test_min_nodes_asks_slurm_for_a_range_with_the_spares_on_top() -> None:
    assert sbatch_flags(slurm(nodes=4, min_nodes=2))["nodes"] == "2-4"
    # A node's CPUs as one task's: Slurm keeps a started job's task count when it is requeued, and with
    # --ntasks-per-node that count would hold the job to the nodes it first got.
    ranged = sbatch_flags(slurm(nodes=4, min_nodes=2, tasks_per_node=3, cpus_per_task=2))
    assert "ntasks-per-node" not in ranged and ranged["cpus-per-task"] == "6"
    fixed = sbatch_flags(slurm(nodes=4, tasks_per_node=3, cpus_per_task=2))
    assert (fixed["ntasks-per-node"], fixed["cpus-per-task"]) == ("3", "2")
    assert sbatch_flags(slurm(nodes=4, min_nodes=2, spare_nodes=1))["nodes"] == "2-5"
    assert sbatch_flags(slurm(nodes=4, min_nodes=4, spare_nodes=1))["nodes"] == "5"
    assert sbatch_flags(slurm(nodes=4))["nodes"] == "4"


def test_submitit_writes_the_range_over_its_own_node_count(tmp_path: Path) -> None:
    """submitit counts tasks with its ``nodes`` (a number): the range goes in additional_parameters, which
    submitit writes instead of its own --nodes line (what _submit_submitit relies on)."""
    from submitit.slurm.slurm import _make_sbatch_string

    text = _make_sbatch_string(command="true", folder=tmp_path, nodes=4, additional_parameters={"nodes": "2-4"})
    assert [line for line in text.splitlines() if line.startswith("#SBATCH --nodes")] == ["#SBATCH --nodes=2-4"]


def test_min_nodes_is_checked_before_anything_is_submitted() -> None:
    from hpc_train.api import compose_config
    from hpc_train.config.shape import Shape, on_nodes

    three = ["cluster=slurm", "cluster.nodes=3", "trainer.batch_size=32", "cluster.slurm.dry_run=true"]
    cfg = compose_config(*three, "cluster.min_nodes=2")
    assert (
        Shape.of(on_nodes(cfg, 2)).describe()
        == "2 nodes x 1 task (global batch 96 = 24 a rank x 2 ranks x 2 accumulated)"
    )
    # On the range's fewest nodes an attempt is no range: what only a range allows is the supervisor's, and the
    # attempt's config no longer asks it (a 2-3 node job left on 2 by a straggler's node failed here).
    ranged = compose_config(
        *three, "cluster.min_nodes=2", "cluster.stragglers.replace_after_s=60", "cluster.slurm.shape=earliest_finish"
    )
    bottom = on_nodes(ranged, 2).cluster
    assert (bottom.nodes, bottom.min_nodes, bottom.stragglers.replace_after_s, bottom.slurm.shape) == (2, 2, 0, "range")
    spared = on_nodes(
        compose_config(
            *three, "cluster.min_nodes=2", "cluster.slurm.spare_nodes=1", "cluster.stragglers.replace_after_s=60"
        ),
        2,
    )
    assert spared.cluster.stragglers.replace_after_s == 60  # a spare is still there to leave a slow node for
    assert (
        on_nodes(
            compose_config(*three, "cluster.nodes=4", "trainer.batch_size=24", "cluster.min_nodes=2"), 3
        ).cluster.min_nodes
        == 2
    )
    with pytest.raises(ConfigError, match=r"cluster.min_nodes=4 is invalid: must be a whole number from 1 to 3"):
        compose_config(*three, "cluster.min_nodes=4")
    with pytest.raises(ConfigError, match=r"gpu_binding.*node range.*HINT: use cluster.slurm.gpu_binding=node"):
        slurm(nodes=3, min_nodes=2, gpus_per_node=2, tasks_per_node=2, gpu_binding="task")
    with pytest.raises(ConfigError, match=r"does not split over 2 ranks .* HINT: remove cluster.min_nodes"):
        compose_config(*three, "cluster.min_nodes=2", "trainer.batch_size=33")
    with pytest.raises(ConfigError, match=r"a script's batch size and data order are its own"):
        compose_config(*three, "cluster.min_nodes=2", "script.command=python")


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
    assert attempt_progressed(with_progress(first_step=31, checkpoint_step=40))
    assert not attempt_progressed(with_progress(first_step=41, step=45))
    assert attempt_progressed(with_progress(script=True, first_step=41, step=45))
    assert not attempt_progressed(with_progress())


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
    book = ledger(as_allocations(*allocations), as_attempts(*attempts), now=200.0)
    first, second = book.per_attempt
    assert (first.kept_step, first.startup_s, first.productive_s, first.redone_s) == (30, 9.0, 30.0, 7.0)
    assert (second.kept_step, second.startup_s, second.productive_s) == (70, 7.0, 40.0)
    assert book.productive_s == 70.0 and book.wall_s == 100.0 and book.ettr == 0.7
    assert book.lost_s == 30.0 and book.restart_gaps_s == pytest.approx(30.0 - 9 - 7 - 7 - 1)
    restart = {"after_attempt": 0, "class": "killed", "in_allocation": True, "latency_s": 11.0}
    # (records without ranks)
    assert [r.to_json() for r in book.restarts] == [restart | {"ranks_before": None, "ranks_after": None}]
    # While the allocation still runs, "now" closes it.
    assert ledger(as_allocations({"job_id": "7", "start": 0.0, "end": None}), [], now=50.0).wall_s == 50.0
    assert ledger([], []).ettr == 0.0


# ---- the restart loop, with a stand-in for srun --------------------------------------------------------------

FAKE_SRUN = """\
import json, os, sys, time
from pathlib import Path
from hpc_train.core.rundir import RunDir, write_json_atomic
argv = sys.argv[1:]
rd = RunDir(Path(argv[argv.index("--run-dir") + 1]))
calls = os.path.join(os.environ["FAKE_SRUN_DIR"], "calls.jsonl")
with open(calls, "a") as f:
    f.write(json.dumps(argv) + "\\n")
with open(os.path.join(os.environ["FAKE_SRUN_DIR"], "nodes_told.txt"), "a") as f:  # an attempt on fewer nodes
    f.write(os.environ.get("HPC_TRAIN_NODES", "-") + "\\n")
n = sum(1 for _ in open(calls)) - 1
plan = json.load(open(os.path.join(os.environ["FAKE_SRUN_DIR"], "plan.json")))[n]
time.sleep(plan.get("sleep", 0))
if plan.get("wait_for_signal"):  # until the supervisor tells the step to stop (cluster.signal: USR2)
    import signal
    got = []
    signal.signal(signal.SIGUSR2, lambda *_: got.append(1))
    deadline = time.time() + plan["wait_for_signal"]
    while not got and time.time() < deadline:
        time.sleep(0.05)
    with open(os.path.join(os.environ["FAKE_SRUN_DIR"], "signalled.txt"), "a") as f:
        f.write(f"{bool(got)}\\n")
attempt = int(os.environ["HPC_TRAIN_ATTEMPT"])
for rank, status in plan.get("statuses", {}).items():
    write_json_atomic(rd.status_path(int(rank)), {"rank": int(rank), "time": time.time(), "attempt": attempt, **status})
if "progress" in plan:
    rd.write_progress(0, {k: (time.time() if v == "now" else v) for k, v in plan["progress"].items()})
for line in plan.get("stderr", []):
    print(line, file=sys.stderr)
sys.exit(plan.get("code", 0))
"""


def supervised(
    tmp_path: Path,
    plan: list[dict[str, object]],
    allocation: str = "node[1-3]",
    requeue: int = 0,
    **cluster: object,
) -> tuple[int, RunDir, list[list[str]]]:
    """Run the supervisor on a 3-node allocation (2 training nodes; ``allocation`` gives others) with srun
    replaced by ``plan``: one entry per srun call (the rank statuses it leaves, rank 0's progress, srun's stderr
    lines, its exit code). ``requeue``: Slurm's restart count of the job (a requeued job's next allocation)."""
    import json
    import os
    import shutil
    import sys

    from omegaconf import OmegaConf

    from hpc_train.runtime.supervisor import supervise

    bindir = tmp_path / f"bin{requeue}"
    bindir.mkdir(parents=True)
    srun = bindir / "srun"
    srun.write_text(f"#!{sys.executable}\n{FAKE_SRUN}")
    srun.chmod(0o755)
    for name in ("scontrol", "squeue", "sbatch"):
        # Slurm that does not answer, unless the test brought its own: a machine's real client commands would
        # ask its controller (on a machine whose testbed is stopped, 2 s each before they give up)
        found = shutil.which(name)
        if found is None or not Path(found).is_relative_to(tmp_path):
            (bindir / name).write_text("#!/bin/sh\nexit 1\n")
            (bindir / name).chmod(0o755)
    (bindir / "plan.json").write_text(json.dumps(plan))
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True, exist_ok=True)
    settings = {"launcher": "slurm", "nodes": 2, "tasks_per_node": 1, "spare_nodes": 1, **cluster}
    saved = {"model": {"name": "mlp"}, "optim": {"name": "adamw"}, "trainer": {"preflight_timeout_s": 1}}
    OmegaConf.save({"cluster": settings, **saved}, rd.config)
    environ = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "FAKE_SRUN_DIR": str(bindir),
        "SLURM_JOB_NODELIST": allocation,
        "SLURM_JOB_ID": "9",
        "SLURM_RESTART_COUNT": str(requeue),
    }
    was = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}:{was}"  # the supervisor asks Slurm (scontrol, squeue) from its own process
    try:
        code = supervise(rd, environ)
    finally:
        os.environ["PATH"] = was
    calls_file = bindir / "calls.jsonl"
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()] if calls_file.exists() else []
    return code, rd, calls


def nodelist(call: list[str]) -> str:
    return next(a for a in call if a.startswith("--nodelist=")).split("=", 1)[1]


RUN = {"state": "running", "step": 35}
DONE = {"state": "completed", "step": 70}
STEPPED = {"first_step": 1, "first_time": "now", "step": 35, "time": "now", "checkpoint_step": 30}


def kill_on(host: str, rank: int, progress: dict[str, object] | None = None) -> dict[str, object]:
    plan: dict[str, object] = {
        "statuses": {"0": {**RUN, "host": "node1"}, str(rank): {**RUN, "host": host}},
        "stderr": [f"srun: error: {host}: task {rank}: Killed"],
        "code": 137,
    }
    if progress is not None:
        plan["progress"] = progress
    return plan


def test_a_job_that_asks_for_a_range_trains_on_what_it_got_and_records_each_change(tmp_path: Path) -> None:
    """cluster.min_nodes=2 of 4: given 2 nodes it trains on 2 (the ranks told so), is requeued, comes back on 4
    and trains on 4; every change of the node count is in reshapes.json, the goodput ledger and jobs status."""
    from hpc_train.launch.state import job_state

    stopped = {"state": "stopped", "step": 35, "signal": 12, "requeued": "9"}
    two = {"statuses": {"0": {**stopped, "host": "node1"}, "1": {**stopped, "host": "node2"}}, "progress": STEPPED}
    four = {"statuses": {str(r): {**DONE, "host": f"node{r + 1}"} for r in range(4)}, "progress": STEPPED}
    wide = {"nodes": 4, "min_nodes": 2, "spare_nodes": 0, "signal": "USR2"}
    code, rd, calls = supervised(tmp_path, [two], "node[1-2]", **wide)
    assert code == 0 and [nodelist(c) for c in calls] == ["node1,node2"]
    assert (tmp_path / "bin0" / "nodes_told.txt").read_text() == "2\n"  # the ranks keep the global batch of 4
    code, rd, calls = supervised(tmp_path, [four], "node[1-4]", requeue=1, **wide)
    assert code == 0 and [nodelist(c) for c in calls] == ["node1,node2,node3,node4"]
    assert (tmp_path / "bin1" / "nodes_told.txt").read_text() == "-\n"
    assert [(a["nodes"], a["ranks"]) for a in rd.read_attempts()] == [
        (["node1", "node2"], 2),
        (["node1", "node2", "node3", "node4"], 4),
    ]
    allocations = rd.allocation_records()
    assert [(a.min_nodes, a.max_nodes, a.asked) for a in allocations] == [
        (2, 4, "asked for 2-4 nodes, got 2"),
        (2, 4, "asked for 2-4 nodes, got 4"),
    ]
    started, grew = rd.reshape_records()
    assert started.was.startswith("4 nodes x 1 task (global batch") and started.onto.startswith("2 nodes x 1 task")
    assert started.why == "attempt 0 in job 9, which asked for 2-4 nodes, got 2 (cluster.min_nodes=2)"
    assert grew.was.startswith("2 nodes x 1 task") and grew.onto.startswith("4 nodes x 1 task")
    assert "which asked for 2-4 nodes, got 4" in grew.why
    assert rd.read_goodput()["reshapes"] == [
        {
            "after_attempt": 0,
            "in_allocation": False,
            "nodes_before": 2,
            "nodes_after": 4,
            "ranks_before": 2,
            "ranks_after": 4,
        }
    ]
    assert "job 9 asked for 2-4 nodes, got 4" in job_state(rd, 4).detail


def test_a_killed_rank_is_restarted_on_the_spare(tmp_path: Path) -> None:
    done = {"statuses": {"0": {**DONE, "host": "node1"}, "1": {**DONE, "host": "node3"}}, "progress": STEPPED}
    code, rd, calls = supervised(tmp_path, [kill_on("node2", 1, STEPPED), done])
    assert code == 0
    assert [nodelist(c) for c in calls] == ["node1,node2", "node1,node3"]
    attempts = rd.read_attempts()
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(0, "failed"), (1, "completed")]
    assert attempts[0]["failure"]["kind"] == "killed" and attempts[0]["failure"]["suspects"] == ["node2"]
    assert [e["host"] for e in rd.read_bad_nodes()] == ["node2"]
    book = rd.read_goodput()
    assert book["attempts"] == 2 and book["restarts"][0]["in_allocation"] is True
    assert rd.read_allocations()[0]["end"] is not None


def test_the_same_exception_twice_ends_the_job_as_fatal(tmp_path: Path) -> None:
    boom = {
        "statuses": {"1": {"state": "failed", "host": "node2", "error": "KeyError: 'restore_state'", "failed_step": 5}},
        "stderr": ["srun: error: node2: task 1: Exited with exit code 1"],
        "code": 1,
    }
    code, rd, calls = supervised(tmp_path, [boom, boom, boom])
    assert code == 86 and len(calls) == 2  # no third attempt
    last = rd.read_attempts()[-1]
    assert last["outcome"] == "fatal" and last["failure"]["kind"] == "repeated_exception"
    assert rd.read_bad_nodes() == []  # a Python error blames no node


def test_the_limits_end_a_crash_loop(tmp_path: Path) -> None:
    progressing = [kill_on("node1", 0, STEPPED)] * 4
    code, rd, calls = supervised(tmp_path, progressing, spare_nodes=0, max_failures=2)
    assert code == 87 and len(calls) == 3  # two restarts, then no more
    assert [nodelist(c) for c in calls] == ["node1,node2"] * 3  # without spares the node is used again
    assert "cluster.slurm.max_failures=2" in rd.read_attempts()[-1]["message"]
    code, rd, calls = supervised(tmp_path / "stalled", [kill_on("node1", 0)] * 4, spare_nodes=0)
    assert code == 87 and len(calls) == 2
    assert "max_stalled_failures=1" in rd.read_attempts()[-1]["message"]


def test_no_healthy_node_left_ends_the_job(tmp_path: Path) -> None:
    plan = [kill_on("node2", 1, STEPPED), kill_on("node3", 1, STEPPED), kill_on("node1", 0, STEPPED)]
    code, rd, calls = supervised(tmp_path, plan, max_stalled_failures=5)
    assert code == 87 and len(calls) == 2
    assert "no healthy node left" in rd.read_attempts()[-1]["message"]


def test_a_step_whose_ranks_never_start_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_train.runtime import supervisor

    monkeypatch.setattr(supervisor, "LAUNCH_GRACE_S", 1)
    done = {"statuses": {"0": {**DONE, "host": "node1"}, "1": {**DONE, "host": "node2"}}}
    code, rd, calls = supervised(tmp_path, [{"sleep": 60}, done], spare_nodes=0)
    assert code == 0 and len(calls) == 2
    failure = rd.read_attempts()[0]["failure"]
    assert failure["kind"] == "unknown" and "no rank of the step started within 2s" in failure["error"]


def test_what_a_killed_batch_step_left_open_is_closed(tmp_path: Path) -> None:
    """A batch step killed with its job (a node failure without --no-kill) leaves its allocation and attempt
    open; the next allocation closes them at the last sign of life, so they do not count until now."""
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    rd.write_allocations(as_allocations({"job_id": "9", "start": 100.0, "end": None}))
    rd.write_attempts(as_attempts({"attempt": 0, "job_id": "9", "start": 101.0, "end": None, "outcome": "running"}))
    abandoned = {"first_step": 1, "first_time": 110.0, "step": 50, "time": 160.0}
    rd.write_progress(0, abandoned | {"checkpoint_step": 40, "checkpoint_time": 150.0})
    done = {
        "statuses": {"0": {**DONE, "host": "node1"}, "1": {**DONE, "host": "node2"}},
        "progress": {"first_step": 41, "first_time": "now", "step": 70, "time": "now"},
    }
    code, rd, _ = supervised(tmp_path, [done])
    assert code == 0
    first = rd.read_attempts()[0]
    assert (first["outcome"], first["end"]) == ("lost", 160.0)
    allocations = rd.read_allocations()
    assert allocations[0]["end"] == 160.0 and len(allocations) == 2
    book = rd.read_goodput()
    # Kept up to the checkpoint of step 40 (at 150), from when step 1 began (110 - one 50/49 s step).
    assert book["per_attempt"][0]["productive_s"] == pytest.approx(150.0 - (110.0 - 50 / 49), abs=0.01)
    assert book["wall_s"] < 60 + 30  # the first allocation counts 60 s, not until now


def test_user_errors_that_mention_networking_words_stay_exceptions() -> None:
    for error in ("KeyError: 'restore_state'", "FileNotFoundError: /datastore/x.bin", "ValueError: timeout < 0"):
        statuses = {1: failed(1, "node1", error)}
        failure = classify(statuses, SrunReport.parse(["srun: error: node1: task 1: Exited with exit code 1"]), 1)
        assert failure.kind == "exception", error


def test_only_srun_speaks_for_srun() -> None:
    """A task printing srun-like text is not taken for srun's own report."""
    report = SrunReport.parse(["my log: Node failure on node2\n", "  srun: error: node1: task 0: Killed\n"])
    assert report.lost_nodes == [] and report.task_exits == []


def test_a_collective_error_seen_first_still_blames_the_rank_that_died_silently() -> None:
    statuses = {0: failed(0, "node1", "RuntimeError: [gloo] Connection closed by peer"), 1: running(1, "node2")}
    report = SrunReport.parse(["srun: error: node1: task 0: Exited with exit code 1\n"])
    failure = classify(statuses, report, 1)
    assert (failure.kind, failure.suspects) == ("killed", ("node2",))


def test_a_collective_error_seen_first_defers_to_the_peer_that_raised() -> None:
    """srun may report the rank that saw "connection closed" before the one that raised (seen on the testbed):
    the exception is the cause, so that the same exception twice is still fatal."""
    statuses = {
        0: failed(0, "node1", "RuntimeError: [gloo] Connection closed by peer", t=3.0),
        1: failed(1, "node2", "RuntimeError: injected fault on rank 1 at step 8", step=8, t=2.5),
    }
    report = SrunReport.parse(["srun: error: node1: task 0: Exited with exit code 1\n"])
    failure = classify(statuses, report, 1)
    assert (failure.kind, failure.rank, failure.host) == ("exception", 1, "node2")
    assert classify(statuses, report, 1, previous=failure).kind == "repeated_exception"


def test_a_requeue_is_not_an_in_allocation_restart() -> None:
    failed_attempt = {
        "attempt": 0,
        "job_id": "7",
        "start": 0.0,
        "end": 10.0,
        "outcome": "failed",
        "failure": {"kind": "killed"},
        "progress": {"first_step": 1, "first_time": 2.0, "step": 8, "time": 9.0},
    }
    after = {"attempt": 1, "job_id": "7", "requeue": 1, "start": 20.0, "end": 30.0, "outcome": "completed"}
    after["progress"] = {"first_step": 9, "first_time": 25.0, "step": 20, "time": 29.0}
    book = ledger(
        as_allocations({"job_id": "7", "start": 0.0, "end": 10.0}), as_attempts(failed_attempt, after), now=40.0
    )
    assert book.restarts[0].in_allocation is False


def test_the_ledger_reads_the_attempts_once_per_allocation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor is the attempts' only writer: it reads them when the allocation begins and keeps them."""
    reads: list[int] = []
    original = RunDir.checked_attempts

    def counted(self: RunDir) -> tuple[list[AttemptRecord], list[str]]:
        reads.append(1)
        return original(self)

    monkeypatch.setattr(RunDir, "checked_attempts", counted)
    done = {"statuses": {"0": {**DONE, "host": "node1"}, "1": {**DONE, "host": "node2"}}, "progress": STEPPED}
    plan = [kill_on("node2", 1, STEPPED), kill_on("node2", 1, STEPPED), done]
    code, rd, calls = supervised(tmp_path, plan, spare_nodes=0)
    assert code == 0 and len(calls) == 3
    assert len(reads) == 1
    monkeypatch.undo()
    assert [a["outcome"] for a in rd.read_attempts()] == ["failed", "failed", "completed"]


def stopped(rank: int, host: str, signal: int, requeued: str | None = None) -> RankStatus:
    return RankStatus(
        rank=rank, state=RankState.STOPPED, host=host, step=40, time=2.0, signal=signal, requeued=requeued
    )


def completed(rank: int) -> RankStatus:
    return RankStatus(rank=rank, state=RankState.COMPLETED, host="node1", step=80, time=3.0)


def test_the_attempts_outcome_is_decided_from_what_its_step_left_in_order() -> None:
    """``attempt_outcome``: completed, then cancelled, then stopped (the supervisor's signal, or ranks on the
    preemption signal or requeued; a SIGTERM from srun after another task failed is no stop), then failed of
    what ``classify`` finds; a step that never launched failed of that, whatever srun said while being ended."""
    from hpc_train.runtime.failures import CANCELLED, StepEnd, attempt_outcome

    usr1, term = 10, 15
    kill = SrunReport.parse(SRUN_KILL)

    def end(statuses: dict[int, RankStatus], **given: Any) -> tuple[str, str, str | None]:
        step = StepEnd(
            **{"statuses": statuses, "ranks": 2, "exit_code": 137, "srun": kill, "stop_signal": usr1, **given}
        )
        found = attempt_outcome(step)
        return str(found.outcome), found.message, None if found.failure is None else str(found.failure.kind)

    assert end({0: completed(0), 1: completed(1)}, cancelled=True) == ("completed", "", None)
    assert end({0: completed(0)}) == ("failed", "", "killed")  # rank 1 never said it completed
    assert end({0: running(0, "node1")}, cancelled=True, signalled=True) == ("stopped", CANCELLED, None)
    assert end({0: running(0, "node1")}, signalled=True) == ("stopped", "", None)
    assert end({0: stopped(0, "node1", usr1), 1: failed(1, "node2", "Killed")}) == ("stopped", "", None)
    assert end({0: stopped(0, "node1", term, requeued="7")}) == ("stopped", "", None)
    quiet = SrunReport([], [])
    assert end({0: stopped(0, "node1", term), 1: failed(1, "node2", "ValueError: x")}, srun=quiet) == (
        "failed",
        "",
        "exception",
    )
    timed_out = attempt_outcome(StepEnd({}, 2, 143, kill, usr1, launch_timeout_s=130.0))
    assert timed_out.failure is not None and str(timed_out.failure.kind) == "unknown"
    assert timed_out.failure.error == "no rank of the step started within 130s; the supervisor ended srun"
    first = attempt_outcome(StepEnd({1: failed(1, "node2", "ValueError: x")}, 2, 1, SrunReport([], []), usr1))
    again = StepEnd({1: failed(1, "node2", "ValueError: x")}, 2, 1, SrunReport([], []), usr1, previous=first.failure)
    assert str(attempt_outcome(again).failure.kind) == "repeated_exception"  # type: ignore[union-attr]
