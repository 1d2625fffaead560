"""Where a rank's start-up went: each phase timed, in the rank's log and its node's summary; jobs status names
the slowest rank of each phase."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_train.core.nodes import NodeChannel
from hpc_train.core.records import NodeSummary, StartupProfile
from hpc_train.core.rundir import RunDir
from hpc_train.distributed import resolve_environment
from hpc_train.runtime import startup as startup_module
from hpc_train.runtime.observers import StartupMarks
from hpc_train.runtime.startup import Startup, process_started_at
from hpc_train.tools.jobs import slowest_startup, startup_maxima
from hpc_train.train.hooks import BUILDING_MODEL, STARTING_FIT


def test_each_phase_runs_from_the_end_of_the_one_before(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(startup_module, "process_started_at", lambda: 100.0)
    startup = Startup()
    startup.marks = {"interpreter": 100.5, "resolve": 100.6, "imports": 102.6, "rendezvous": 103.0}
    startup.mark("rendezvous")  # a phase marked again keeps its first end
    startup.marks["process_group"] = 103.25
    profile = startup.profile(3, "n1")
    assert (profile.interpreter_s, profile.resolve_s, profile.imports_s) == (0.5, pytest.approx(0.1), 2.0)
    assert (profile.rendezvous_s, profile.process_group_s, profile.model_s) == (0.4, pytest.approx(0.25), None)
    assert profile.own_s == pytest.approx(0.35) and profile.total_s == pytest.approx(3.25)
    assert profile.describe().startswith("start-up 3.25 s: interpreter 0.50, resolve 0.10, imports 2.00")
    assert profile.describe().endswith("(hpc_train's own 0.35 s)")


def test_the_process_start_is_read_from_proc() -> None:
    started = process_started_at()
    assert started is not None and 0 <= time.time() - started < 3600


def test_the_trainer_s_phases_and_the_first_step_reach_the_node(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd = RunDir(rd.path, node=NodeChannel.open(rd.path, rd.node_summary, job="1.0.0", local_ranks=1, base=tmp_path))
    rd.write_status(0, "running")
    startup = Startup()
    marks = StartupMarks(startup, rd, 0, "n1")
    marks.on_phase(BUILDING_MODEL)
    marks.on_phase(STARTING_FIT)
    marks.on_step(1)
    marks.on_step(2)
    assert set(startup.marks) == {"interpreter", "data", "model", "first_step"}
    assert rd.node is not None and rd.node.flush() is not None
    (profile,) = RunDir(rd.path).startup_profiles().values()
    assert profile.rank == 0 and profile.first_step_s is not None and profile.rendezvous_s is None


def test_jobs_status_names_the_slowest_rank_of_each_phase(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    fast = StartupProfile(rank=0, host="a", imports_s=2.0, rendezvous_s=0.5, model_s=0.2)
    slow = StartupProfile(rank=5, host="b", imports_s=3.0, rendezvous_s=0.1, model_s=0.3)
    for name, profile in (("a", fast), ("b", slow)):
        rd.status_dir.mkdir(parents=True, exist_ok=True)
        summary = NodeSummary(host=name, time=1.0, startup=(profile,))
        rd.node_summary(name).write_text(json.dumps(summary.to_json()))
    maxima = startup_maxima(rd)
    assert {phase: (s, p.rank) for phase, (s, p) in maxima.items()} == {
        "imports": (3.0, 5),
        "rendezvous": (0.5, 0),
        "model": (0.3, 5),
        "own": (0.3, 5),
    }
    assert slowest_startup(rd) == (
        "2 ranks: imports 3.00 (rank 5, b), rendezvous 0.50 (rank 0, a), model 0.30 (rank 5, b), "
        "hpc_train own 0.30 (rank 5, b)"
    )


def _script_run_dir(tmp_path: Path, node: bool) -> RunDir:
    rd = RunDir(tmp_path / "run")
    channel = NodeChannel.open(rd.path, rd.node_summary, job="1.0.0", local_ranks=1, base=tmp_path) if node else None
    rd = RunDir(rd.path, node=channel)
    rd.write_status(0, "running")  # as run_user_script does first
    return rd


@pytest.mark.parametrize("node", [True, False])
def test_a_script_s_start_up_ends_at_the_first_step_it_reports(tmp_path: Path, monkeypatch, node: bool) -> None:  # type: ignore[no-untyped-def]
    from hpc_train.core.records import Progress
    from hpc_train.runtime import script as script_module

    monkeypatch.setattr(script_module, "FIRST_STEP_POLL_S", 0.05)
    rd = _script_run_dir(tmp_path, node)
    env = resolve_environment({})
    startup = Startup()
    startup.mark("resolve")
    with script_module.script_startup(rd, env, startup):
        if node:  # reported as the script starts: the worker's own phases, no script phase yet
            (before,) = _flushed(rd)
            assert before.resolve_s is not None and before.imports_s is not None and before.script_s is None
        stepped = time.time() + 0.3  # the step the script reports is the end of its start-up, not the poll's
        rd.write_progress(0, Progress(first_step=1, first_time=stepped, step=1, time=stepped))
        if node:
            deadline = time.monotonic() + 5
            while "script" not in startup.marks and time.monotonic() < deadline:
                time.sleep(0.02)
            assert "script" in startup.marks  # seen while the script runs, not only at its end
    assert startup.marks["script"] == stepped
    if node:
        (profile,) = _flushed(rd)
        assert profile.script_s == pytest.approx(stepped - startup.marks["imports"], abs=1e-3)
        assert profile.own_s == pytest.approx(profile.resolve_s or 0.0)


def test_a_script_that_reports_no_step_has_no_script_phase(tmp_path: Path) -> None:
    from hpc_train.runtime.script import script_startup

    rd = _script_run_dir(tmp_path, True)
    startup = Startup()
    with script_startup(rd, resolve_environment({}), startup):
        pass
    assert "script" not in startup.marks
    (profile,) = _flushed(rd)
    assert profile.script_s is None and profile.interpreter_s is not None


def _flushed(rd: RunDir) -> list[StartupProfile]:
    assert rd.node is not None and rd.node.flush() is not None
    return list(RunDir(rd.path).startup_profiles().values())
