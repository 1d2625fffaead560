"""Stragglers (hpc_train.distributed.stragglers): each rank's own compute time, rank 0's verdict per window, and
where the verdict goes (the log, status/stragglers.json, the trackers)."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

import pytest
import torch

from hpc_train.core.errors import ConfigError
from hpc_train.core.records import BadNode, SlowRank, StragglerReport
from hpc_train.core.rundir import RunDir
from hpc_train.distributed.stragglers import ComputeClock, RankWindow, StragglerJudge, others_median, rank_places
from hpc_train.runtime.observers import StragglerLog
from hpc_train.tools.api import compose_config


class _Slow(torch.nn.Module):
    """A model whose forward takes at least ``pause`` seconds (a test's stand-in for slow compute)."""

    def __init__(self, pause: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.pause = pause

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.pause)
        return self.layer(x)


def _step(model: torch.nn.Module) -> None:
    model(torch.ones(2, 4)).sum().backward()


def test_the_clock_counts_forward_and_backward_and_nothing_after() -> None:
    model = _Slow(pause=0.05)
    clock = ComputeClock(model)
    _step(model)
    time.sleep(0.2)  # the optimizer, the data, a wait: not the rank's forward and backward
    _step(model)
    seconds, intervals = clock.take()
    assert intervals == 2 and 0.1 <= seconds < 0.3, seconds
    assert clock.take() == (0.0, 0)  # taken: the next window starts empty


def test_a_forward_without_backward_is_not_counted() -> None:
    model = _Slow(pause=0.05)
    clock = ComputeClock(model)
    with torch.no_grad():
        model(torch.ones(2, 4))  # validation
    model(torch.ones(2, 4))  # a forward whose backward never comes (an exception, a skipped batch)
    assert clock.take() == (0.0, 0)
    _step(model)
    assert clock.take()[1] == 1


def test_closing_the_clock_removes_its_hooks() -> None:
    model = _Slow()
    clock = ComputeClock(model)
    clock.close()
    _step(model)
    assert clock.take() == (0.0, 0)
    assert not model._forward_pre_hooks and all(not p._post_accumulate_grad_hooks for p in model.parameters())  # type: ignore[attr-defined]


def _window(*per_step: float) -> list[RankWindow]:
    return [RankWindow(rank, s, host=f"n{rank}", device="cpu") for rank, s in enumerate(per_step)]


def test_a_rank_slow_for_enough_windows_in_a_row_is_named_with_what_it_costs() -> None:
    judge = StragglerJudge(margin=1.25, windows=3)
    figures = _window(0.10, 0.11, 0.10, 0.20)
    first = judge.judge(figures, step=100, now=1000.0)
    assert first.ranks == () and first.median_s == pytest.approx(0.10)  # slow once: not yet
    judge.judge(figures, step=200, now=1060.0)
    third = judge.judge(figures, step=300, now=1120.0)
    (slow,) = third.ranks
    assert (slow.rank, slow.host, slow.since_step, slow.since_time, slow.windows) == (3, "n3", 100, 1000.0, 3)
    assert slow.slowdown == pytest.approx(0.20 / 0.10, rel=1e-3)  # against ranks 0-2: 0.10, 0.11, 0.10
    assert third.lost_fraction == pytest.approx(1 - 0.10 / 0.20)
    assert "rank 3 (n3, cpu) 2.00x the others' median for 3 windows, since step 100" in third.describe()
    assert "(the others' median 0.1000 s/step); the job loses 50% of its samples/s" in third.describe()


def test_the_slow_one_of_two_ranks_is_judged_against_the_other_not_the_mean_of_both() -> None:
    """The noisy neighbour of issue 59 (rank 1's own compute 0.0916 s against rank 0's 0.0534 s): against the
    median of both (their mean) it was 1.26x, never three windows in a row above 1.25; against rank 0 it is 1.71x.
    The fast rank is not slow against the slow one."""
    judge = StragglerJudge(margin=1.25, windows=3)
    for step in (1, 2, 3):
        report = judge.judge(_window(0.0534, 0.0916), step=step, now=float(step))
    (slow,) = report.ranks
    assert (slow.rank, slow.slowdown, report.median_s) == (1, pytest.approx(1.715, abs=1e-3), 0.0534)
    assert report.lost_fraction == pytest.approx(1 - 0.0534 / 0.0916)  # 42%, not the 21% the mean said
    noise = StragglerJudge(margin=1.25, windows=1)
    assert noise.judge(_window(0.10, 0.12), step=1).ranks == ()  # 1.2x: under the margin


@pytest.mark.parametrize("per_node", [2, 4, 8])
def test_a_whole_slow_node_of_two_is_named_rank_by_rank_and_a_slow_majority_is_the_pace(per_node: int) -> None:
    """Two nodes, one 1.5x slower: half the ranks are slow, so the median of all sat between slow and fast (1.2x
    a slow rank: never named); each slow rank's others are mostly fast ones."""
    judge = StragglerJudge(margin=1.25, windows=1)
    report = judge.judge(_window(*[0.10] * per_node, *[0.15] * per_node), step=1)
    assert sorted(r.rank for r in report.ranks) == list(range(per_node, 2 * per_node)), report
    assert {r.slowdown for r in report.ranks} == {1.5} and report.median_s == 0.10
    # Three slow nodes of four: the slow ones are the job's pace, and the fast node is not a straggler either.
    assert judge.judge(_window(0.10, *[0.15] * 3), step=2).ranks == ()


def test_each_ranks_reference_is_the_median_of_the_others() -> None:
    figures = _window(0.3, 0.1, 0.2, 0.4, 0.1)
    others = others_median(figures)
    for f in figures:
        assert others[f.rank] == pytest.approx(statistics.median(g.per_step_s for g in figures if g is not f))
    assert others_median(_window(0.1, 0.3)) == {0: 0.3, 1: 0.1}


def test_a_window_at_normal_speed_starts_the_count_again_and_no_slow_rank_names_none() -> None:
    judge = StragglerJudge(margin=1.25, windows=2)
    judge.judge(_window(0.1, 0.1, 0.3), step=1)
    judge.judge(_window(0.1, 0.1, 0.1), step=2)  # recovered
    assert judge.judge(_window(0.1, 0.1, 0.3), step=3).ranks == ()
    assert judge.judge(_window(0.1, 0.1, 0.3), step=4).ranks[0].since_step == 3
    steady = StragglerJudge(margin=1.25, windows=1)
    assert steady.judge(_window(0.1, 0.11, 0.12, 0.1), step=1).ranks == ()  # noise, under the margin


def test_ranks_that_measured_nothing_take_no_part() -> None:
    judge = StragglerJudge(margin=1.25, windows=1)
    report = judge.judge(_window(0.0, 0.1, 0.1, 0.0), step=5)  # two ranks with no step in the window
    assert report.ranks == () and report.median_s == pytest.approx(0.1)
    assert judge.judge(_window(0.2), step=6).ranks == ()  # one rank: nobody to compare with


def test_the_device_of_a_rank_names_its_gpu_as_the_node_numbers_it(tmp_path: Path) -> None:
    """From rank_table.json as the worker writes it; a damaged row is left out."""
    same = {"local_rank": 0, "node": 0, "backend": "nccl", "master": "g1:29500", "source": "slurm", "pid": 7}
    rows = [
        {**same, "rank": 0, "host": "g1", "device": "cuda:0", "cuda_visible_devices": "4,5", "attempt": 0},
        {**same, "rank": 1, "host": "g1", "device": "cuda:1", "cuda_visible_devices": "4,5", "attempt": 0},
        {**same, "rank": 2, "host": "c1", "device": "cpu", "cuda_visible_devices": "", "attempt": 0},
        {**same, "rank": "x"},
    ]
    run_dir = RunDir(tmp_path)
    run_dir.rank_table.write_text(json.dumps(rows))
    entries = run_dir.rank_table_entries()
    assert [e.to_json() for e in entries] == rows[:3]  # the JSON as it was written, key for key
    assert rank_places(entries) == {0: ("g1", "cuda:0 (GPU 4)"), 1: ("g1", "cuda:1 (GPU 5)"), 2: ("c1", "cpu")}


def _report(step: int, *slow: int, now: float = 0.0) -> StragglerReport:
    ranks = tuple(SlowRank(rank=r, host=f"n{r}", slowdown=1.5, since_step=1) for r in slow)
    return StragglerReport(time=now or float(step), step=step, median_s=0.1, slowest_s=0.15, ranks=ranks)


def test_the_verdicts_keep_one_entry_per_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_train.core import rundir as rundir_module

    monkeypatch.setattr(rundir_module, "STRAGGLER_ENTRIES", 10)
    rd = RunDir(tmp_path)
    for step, slow in [(1, ()), (2, ()), (3, (2,)), (4, (2,)), (5, (2, 3)), (6, ())]:
        rd.record_stragglers(_report(step, *slow))
    entries = rd.straggler_reports()
    assert [(e.step, [r.rank for r in e.ranks]) for e in entries] == [(2, []), (4, [2]), (5, [2, 3]), (6, [])]
    for step in range(7, 40):  # a rank that flaps: bounded
        rd.record_stragglers(_report(step, *((1,) if step % 2 else ())))
    assert len(rd.straggler_reports()) == 10 and rd.straggler_reports()[-1].step == 39


def test_rank_0_logs_each_window_with_a_straggler_and_says_when_it_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    observer = StragglerLog(RunDir(tmp_path))
    with caplog.at_level(logging.INFO, logger="hpc_train"):
        observer.on_stragglers(_report(10))
        observer.on_stragglers(_report(20, 3))
        observer.on_stragglers(_report(30))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("straggler: rank 3 (n3) 1.50x the others' median")
    assert lines[1] == "straggler cleared: rank 3 (n3) is no longer slow (step 30)"
    assert [e.step for e in RunDir(tmp_path).straggler_reports()] == [10, 20, 30]


def test_the_trackers_get_the_slowest_rank_and_each_slow_node() -> None:
    report = StragglerReport(
        time=1.0,
        step=5,
        median_s=0.1,
        slowest_s=0.2,
        ranks=(
            SlowRank(rank=3, host="n2", slowdown=2.0),
            SlowRank(rank=2, host="n2", slowdown=1.6),
            SlowRank(rank=7, slowdown=1.3),
        ),
    )
    assert report.tracker_figures() == {
        "stragglers/slowest_x_median": 2.0,
        "stragglers/count": 3.0,
        "stragglers/node/n2": 2.0,
        "stragglers/node/rank7": 1.3,
    }
    assert StragglerReport(time=1.0).tracker_figures() == {}


def test_jobs_status_shows_the_stragglers_now_or_the_last_ones(tmp_path: Path) -> None:
    from hpc_train.tools.jobs import straggler_lines

    rd = RunDir(tmp_path)
    assert straggler_lines(rd, 100.0) == []  # never measured
    rd.record_stragglers(_report(10, now=50.0))
    assert straggler_lines(rd, 100.0) == []  # measured, never slow
    rd.record_stragglers(_report(20, 3, now=60.0))
    (now,) = straggler_lines(rd, 100.0)
    assert now.startswith(f"{rd.path}: straggler: rank 3 (n3) 1.50x") and now.endswith("(step 20, 40 s ago)")
    rd.record_stragglers(_report(30, now=70.0))
    (then,) = straggler_lines(rd, 100.0)
    assert (
        then
        == f"{rd.path}: none now (step 30, 30 s ago); the last: rank 3 (n3) 1.50x the others' median, since step 1, until step 20"
    )


def test_a_hook_runs_after_its_module_is_first_imported_and_never_imports_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib
    import sys

    from hpc_train.runtime.script_clock import _AfterImport

    (tmp_path / "pkg_after").mkdir()
    (tmp_path / "pkg_after" / "__init__.py").write_text("")
    (tmp_path / "pkg_after" / "target.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    hook = _AfterImport("pkg_after.target", lambda module: seen.append(module.Thing.__name__))
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    importlib.import_module("pkg_after")
    assert seen == [] and hook in sys.meta_path  # the package alone: not yet
    importlib.import_module("pkg_after.target")
    assert seen == ["Thing"] and hook not in sys.meta_path  # once, then out of the way
    for name in ("pkg_after.target", "pkg_after"):
        sys.modules.pop(name)


def test_rank_0_s_worker_judges_each_rank_s_newest_figure_once(tmp_path: Path) -> None:
    from hpc_train.core.records import NodeSummary, RankCompute
    from hpc_train.runtime.script_clock import judge_from_summaries

    def node(host: str, *figures: tuple[int, float, float]) -> NodeSummary:
        compute = tuple(
            RankCompute(rank=r, time=t, per_interval_s=s, intervals=10, device="cpu") for r, t, s in figures
        )
        return NodeSummary(host=host, time=100.0, compute=compute)

    judge = StragglerJudge(margin=1.25, windows=1)
    summaries = [node("a", (0, 99.0, 0.1), (1, 98.0, 0.1)), node("b", (2, 99.5, 0.3), (3, 80.0, 5.0))]
    report = judge_from_summaries(summaries, judge, now=100.0, window_s=5.0)
    assert report is not None and report.ranks_measured == 3  # rank 3's figure is older than two windows
    (slow,) = report.ranks
    assert (slow.rank, slow.host, slow.since_step) == (2, "b", None)
    assert judge_from_summaries(summaries, judge, now=101.0, window_s=5.0) is None  # nothing new since


def test_a_slow_rack_is_one_line_naming_the_first_five(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    many = _report(10, *range(8))
    assert (
        many.describe().count("rank ") == 5
        and "; rank 4 (n4) 1.50x the others' median, since step 1 and 3 more" in many.describe()
    )
    observer = StragglerLog(RunDir(tmp_path))
    with caplog.at_level(logging.INFO, logger="hpc_train"):
        observer.on_stragglers(many)
        observer.on_stragglers(_report(20))
    (cleared,) = [r.getMessage() for r in caplog.records if "cleared" in r.getMessage()]
    assert (
        cleared
        == "stragglers cleared: rank 0 (n0), rank 1 (n1), rank 2 (n2), rank 3 (n3), rank 4 (n4) and 3 more are no longer slow (step 20)"
    )


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.stragglers.replace_after_s=60"],  # the local launcher: no allocation to go on in
        ["cluster=slurm", "cluster.stragglers.replace_after_s=60"],  # Slurm, but no spare and no range
    ],
)
def test_replacing_a_slow_node_needs_a_spare_or_a_range(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.stragglers\.replace_after_s=60.0 is invalid.*HINT: add cluster"):
        compose_config(*overrides)
    assert compose_config(
        "cluster=slurm", "cluster.slurm.spare_nodes=1", *overrides[-1:]
    ).cluster.stragglers.replace_after_s
    assert compose_config("cluster=slurm", "cluster.nodes=2", "cluster.min_nodes=1", *overrides[-1:])


def test_the_supervisors_restart_request_stops_the_ranks_without_a_requeue(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    assert rd.restart_requested() is None
    rd.request_restart(BadNode(host="node2", why="straggler: rank 1 (node2) 1.50x the others' median", attempt=0))
    assert rd.restart_requested() == BadNode(
        host="node2", why="straggler: rank 1 (node2) 1.50x the others' median", attempt=0
    )
    rd.clear_restart_request()
    assert rd.restart_requested() is None and not rd.restart_request.exists()


def test_the_supervisor_leaves_a_node_slow_for_replace_after_s_and_goes_on_with_the_spare(tmp_path: Path) -> None:
    """A straggler named on node2 for longer than cluster.stragglers.replace_after_s: the supervisor blames
    node2, tells the step to stop, and starts the next attempt in the same allocation on node1 and the spare."""
    from .test_recovery import nodelist, supervised

    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    slow = SlowRank(rank=1, host="node2", device="cpu", slowdown=1.6, since_step=10, since_time=time.time() - 30)
    rd.record_stragglers(StragglerReport(time=time.time() + 5, step=40, median_s=0.01, slowest_s=0.016, ranks=(slow,)))
    stopped = {"0": {"state": "stopped", "step": 40, "signal": 12, "host": "node1"}}
    done = {
        "0": {"state": "completed", "step": 70, "host": "node1"},
        "1": {"state": "completed", "step": 70, "host": "node3"},
    }
    plan = [{"wait_for_signal": 30, "statuses": stopped}, {"statuses": done}]
    code, rd, calls = supervised(tmp_path, plan, **{"stragglers": {"replace_after_s": 10}})
    assert code == 0 and [nodelist(c) for c in calls] == ["node1,node2", "node1,node3"]
    assert (tmp_path / "bin0" / "signalled.txt").read_text() == "True\n"
    (bad,) = rd.bad_node_records()
    assert bad.host == "node2" and bad.why.startswith("straggler: rank 1 (node2, cpu) 1.60x the others' median"), bad
    assert [a.outcome.value for a in rd.attempt_records()] == ["stopped", "completed"]
    assert rd.restart_requested() is None  # consumed by the next attempt


def test_rank_0_of_a_script_reads_each_new_verdict_of_its_worker_once(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from hpc_train.core.nodes import NODE_DIR_VARIABLE, NodeChannel
    from hpc_train.runtime.script_clock import WINDOW_VARIABLE, TrackerFigures

    channel = NodeChannel.open(tmp_path, RunDir(tmp_path).node_summary, job="1", local_ranks=2, base=tmp_path / "shm")
    environ = {
        "RANK": "0",
        WINDOW_VARIABLE: "1",
        "HPC_TRAIN_RUN_DIR": str(tmp_path),
        NODE_DIR_VARIABLE: str(channel.folder),
    }
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    figures = TrackerFigures(environ)
    assert figures.new() == {}  # no verdict yet
    slow = SlowRank(rank=1, host="node7", device="cpu", slowdown=2.0, per_step_s=0.2, since_step=4, since_time=1.0)
    channel.publish_stragglers(StragglerReport(time=10.0, step=9, median_s=0.1, slowest_s=0.2, ranks=(slow,)))
    assert figures.new() == {}  # checked less than a second ago
    clock[0] += 1.0
    assert figures.new() == {"stragglers/slowest_x_median": 2.0, "stragglers/count": 1.0, "stragglers/node/node7": 2.0}
    clock[0] += 1.0
    assert figures.new() == {}  # the same verdict: logged once
    channel.publish_stragglers(StragglerReport(time=12.0, step=11, median_s=0.1, slowest_s=0.11))
    clock[0] += 1.0
    assert figures.new() == {"stragglers/slowest_x_median": 1.1, "stragglers/count": 0.0}  # node7 recovered
    for other in ({**environ, "RANK": "1"}, {**environ, WINDOW_VARIABLE: "0"}, {**environ, NODE_DIR_VARIABLE: ""}):
        clock[0] += 1.0
        assert TrackerFigures(other).new() == {}  # another rank, stragglers off, no node channel


def test_the_supervisor_keeps_a_slow_node_when_the_job_ends_within_twice_the_lead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named as above, but squeue says the job ends in 100 s, within twice the 90 s lead: the time limit's stop is
    due before a next attempt could train, so the node stays and the step runs on to Slurm's own signal."""
    import sys
    from datetime import datetime

    from .test_recovery import supervised

    bindir = tmp_path / "slurm"
    bindir.mkdir()
    ends = datetime.fromtimestamp(time.time() + 100).isoformat(timespec="seconds")
    (bindir / "squeue").write_text(f"#!{sys.executable}\nprint('{ends}')\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    slow = SlowRank(rank=1, host="node2", device="cpu", slowdown=1.6, since_step=10, since_time=time.time() - 30)
    rd.record_stragglers(StragglerReport(time=time.time() + 5, step=40, median_s=0.01, slowest_s=0.016, ranks=(slow,)))
    done = {
        "0": {"state": "completed", "step": 70, "host": "node1"},
        "1": {"state": "completed", "step": 70, "host": "node2"},
    }
    code, rd, calls = supervised(
        tmp_path, [{"wait_for_signal": 3, "statuses": done}], stragglers={"replace_after_s": 10}
    )
    assert code == 0 and len(calls) == 1
    assert (tmp_path / "bin0" / "signalled.txt").read_text() == "False\n"  # not told to stop
    assert rd.bad_node_records() == [] and rd.restart_requested() is None
