"""A node's ranks report through the node (hpc_train.core.nodes): one summary file per node in the run dir."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import hpc_train.core.nodes as nodes
from hpc_train.core.nodes import NodeChannel
from hpc_train.core.records import NodeSummary, Progress, RankState
from hpc_train.core.rundir import RunDir


def _rank(run_dir: Path, shm: Path, local_ranks: int = 2) -> RunDir:
    """A rank's run dir, its node channel under ``shm`` (what /dev/shm is on a node)."""
    rd = RunDir(run_dir)
    return RunDir(
        run_dir, node=NodeChannel.open(run_dir, rd.node_summary, job="7.0.0", local_ranks=local_ranks, base=shm)
    )


def _summary(rd: RunDir) -> NodeSummary:
    (summary,) = rd.node_summaries()
    return summary


def test_ranks_of_a_node_share_one_folder_and_one_summary(tmp_path: Path) -> None:
    rank0, rank1 = _rank(tmp_path / "run", tmp_path / "shm"), _rank(tmp_path / "run", tmp_path / "shm")
    assert rank0.node is not None and rank1.node is not None and rank0.node.folder == rank1.node.folder
    rank0.write_status(0, RankState.RUNNING, step=5)
    rank1.write_status(1, RankState.RUNNING, step=5)
    assert not (tmp_path / "run" / "status").exists(), "a running rank's status stays on the node"
    rank0.node.flush()
    files = sorted(p.name for p in (tmp_path / "run" / "status").iterdir())
    assert files == [f"node_{rank0.node.host}.json"]
    assert [(r.rank, r.step) for r in _summary(rank0).ranks] == [(0, 5), (1, 5)]
    assert {r: s.step for r, s in RunDir(tmp_path / "run").rank_statuses().items()} == {0: 5, 1: 5}
    assert RunDir(tmp_path / "run").read_statuses()[1]["state"] == "running"


def test_another_attempt_or_run_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    first = NodeChannel.open(rd.path, rd.node_summary, job="7.0.0", local_ranks=1, base=tmp_path)
    again = NodeChannel.open(rd.path, rd.node_summary, job="7.0.1", local_ranks=1, base=tmp_path)
    other = NodeChannel.open(tmp_path / "other", rd.node_summary, job="7.0.0", local_ranks=1, base=tmp_path)
    assert len({first.folder, again.folder, other.folder}) == 3


def test_a_flush_is_due_at_the_period_or_soon_after_a_change_of_state(tmp_path: Path) -> None:
    rd = _rank(tmp_path / "run", tmp_path / "shm")
    channel = rd.node
    assert channel is not None
    rd.write_status(0, RankState.STARTING)
    assert channel.due(time.monotonic()), "the first flush is due at once"
    channel.flush()
    flushed = time.monotonic()
    rd.write_status(0, RankState.STARTING)  # the same state again: no news
    assert not channel.due(flushed + nodes.SOON_S + 0.1)
    rd.write_status(0, RankState.RUNNING, step=1)
    assert not channel.due(flushed + nodes.SOON_S / 2), "changes within SOON_S are gathered into one flush"
    assert channel.due(flushed + nodes.SOON_S + 0.1)
    channel.flush()
    flushed = time.monotonic()
    rd.write_status(0, RankState.RUNNING, step=2)  # a heartbeat: waits for the period
    assert not channel.due(flushed + nodes.NODE_EVERY_S - 1)
    assert channel.due(flushed + nodes.NODE_EVERY_S)


def test_an_ending_rank_flushes_at_once_and_rank_0_and_failures_keep_a_file_of_their_own(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rank0, rank1, rank2 = (_rank(run, tmp_path / "shm", local_ranks=3) for _ in range(3))
    for rank, rd in enumerate((rank0, rank1, rank2)):
        rd.write_status(rank, RankState.RUNNING, step=3)
    rank0.write_progress(0, Progress(first_step=1, first_time=1.0, step=3, time=2.0))
    rank1.write_status(1, RankState.COMPLETED, step=4)
    assert {s.rank: s.state for s in _summary(rank1).ranks}[1] is RankState.COMPLETED
    assert not RunDir(run).status_path(1).exists(), "a rank that completed is in its node's summary only"
    rank2.write_failure(2, RuntimeError("boom"))
    failed = json.loads(RunDir(run).status_path(2).read_text())
    assert failed["state"] == "failed" and failed["step"] == 3 and "boom" in failed["error"]
    rank0.write_status(0, RankState.COMPLETED, step=4)
    assert json.loads(RunDir(run).status_path(0).read_text())["state"] == "completed"
    assert RunDir(run).read_progress(0)["step"] == 3 and json.loads(RunDir(run).progress(0).read_text())["step"] == 3
    assert {r: s.state.value for r, s in RunDir(run).rank_statuses().items()} == {
        0: "completed",
        1: "completed",
        2: "failed",
    }


def test_the_node_folder_goes_once_every_rank_of_the_node_ended_and_the_summary_stays(tmp_path: Path) -> None:
    rank0, rank1 = _rank(tmp_path / "run", tmp_path / "shm"), _rank(tmp_path / "run", tmp_path / "shm")
    assert rank0.node is not None
    rank0.write_status(0, RankState.COMPLETED, step=9)
    assert rank0.node.folder.is_dir(), "rank 1 still runs"
    rank1.write_status(1, RankState.STOPPED, step=9)
    assert not rank0.node.folder.exists()
    assert rank0.node.flush() is None, "a flush after the end leaves the last summary as it was"
    assert {s.state for s in _summary(rank0).ranks} == {RankState.COMPLETED, RankState.STOPPED}


def test_a_later_status_wins_whether_it_is_in_a_rank_file_or_a_summary(tmp_path: Path) -> None:
    """An in-allocation restart: rank 0 failed on node A (its own file), then runs again, reported by node B."""
    run = tmp_path / "run"
    RunDir(run).write_status(0, RankState.FAILED, error="x")
    rd = _rank(run, tmp_path / "shm", local_ranks=1)
    assert rd.node is not None
    rd.write_status(0, RankState.RUNNING, step=1)
    rd.node.flush()
    assert RunDir(run).rank_statuses()[0].state is RankState.RUNNING
    assert RunDir(run).read_statuses()[0]["state"] == "running"


def test_the_reporter_role_passes_to_another_rank_when_its_holder_ends(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(nodes, "SOON_S", 0.1)
    rank0, rank1 = _rank(tmp_path / "run", tmp_path / "shm"), _rank(tmp_path / "run", tmp_path / "shm")
    assert rank0.node is not None and rank1.node is not None
    rank0.node.every_s = rank1.node.every_s = 0.3
    rank0.write_status(0, RankState.RUNNING, step=1)
    rank1.write_status(1, RankState.RUNNING, step=1)
    rank0.node.start()
    rank1.node.start()
    _wait(lambda: len(RunDir(tmp_path / "run").rank_statuses()) == 2)
    rank0.node.close()  # its thread gave the lock back; rank 1's takes the role
    rank1.write_status(1, RankState.RUNNING, step=2)
    _wait(lambda: RunDir(tmp_path / "run").rank_statuses()[1].step == 2)
    rank1.node.close()


def test_steady_training_writes_one_summary_per_node_per_period(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Four ranks heartbeat every 20 ms for 2 s with a period of 0.5 s: four summaries or five, not 400 files."""
    monkeypatch.setattr(nodes, "SOON_S", 0.1)
    writes: list[Path] = []
    real = nodes.write_json_atomic
    monkeypatch.setattr(nodes, "write_json_atomic", lambda path, *a, **k: (writes.append(path), real(path, *a, **k)))
    ranks = [_rank(tmp_path / "run", tmp_path / "shm", local_ranks=4) for _ in range(4)]
    for rank, rd in enumerate(ranks):
        assert rd.node is not None
        rd.node.every_s = 0.5
        rd.write_status(rank, RankState.RUNNING, step=0)
    for rd in ranks:
        assert rd.node is not None
        rd.node.start()
    time.sleep(0.3)  # the first flush, with every rank running
    writes.clear()
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 2.0:
        step += 1
        for rank, rd in enumerate(ranks):
            rd.write_status(rank, RankState.RUNNING, step=step)
        time.sleep(0.02)
    for rd in ranks:
        assert rd.node is not None
        rd.node.close()
    summaries = [p for p in writes if p.parent.name == "status"]
    assert 3 <= len(summaries) <= 5, summaries
    assert min(s.step or 0 for s in RunDir(tmp_path / "run").rank_statuses().values()) >= step - 30


def test_a_summary_that_cannot_be_written_is_said_once_and_tried_again_each_period(
    tmp_path: Path, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    """A full run dir: the reporter warns once, tries again every period (not every tick), and recovers."""
    monkeypatch.setattr(nodes, "SOON_S", 0.05)
    tries: list[float] = []
    full = [True]
    real = nodes.write_json_atomic

    def write(path: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path.parent.name == "status":
            tries.append(time.monotonic())
            if full[0]:
                raise OSError(28, "No space left on device")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(nodes, "write_json_atomic", write)
    rd = _rank(tmp_path / "run", tmp_path / "shm", local_ranks=1)
    assert rd.node is not None
    rd.node.every_s = 0.4
    rd.write_status(1, RankState.RUNNING, step=1)
    with caplog.at_level("WARNING", logger="hpc_train.core.nodes"):
        rd.node.start()
        time.sleep(1.3)
        full[0] = False
        _wait(lambda: RunDir(tmp_path / "run").node_summaries() != [])
        rd.node.close()
    failed = [t for t in tries if t < tries[-1]]
    assert 2 <= len(failed) <= 5, f"{len(failed)} tries in 1.3 s with a period of 0.4 s"
    warned = [r for r in caplog.records if "could not write its summary" in r.getMessage()]
    assert len(warned) == 1 and "No space left" in warned[0].getMessage(), caplog.text


def test_a_damaged_summary_is_listed_and_its_ranks_left_out(tmp_path: Path) -> None:
    status = tmp_path / "run" / "status"
    status.mkdir(parents=True)
    (status / "node_a.json").write_text('{"host": "a", "time": 1.0, "ranks": [{"rank": "x"}]}')
    (status / "node_b.json").write_text("{trunc")
    statuses, damaged = RunDir(tmp_path / "run").checked_statuses()
    assert statuses == {}
    assert any("node_a.json" in d and "ranks=" in d for d in damaged) and any("node_b.json" in d for d in damaged)


def test_clear_statuses_forgets_the_run_s_own_summaries(tmp_path: Path) -> None:
    rd = _rank(tmp_path / "run", tmp_path / "shm", local_ranks=1)
    assert rd.node is not None
    rd.write_status(0, RankState.RUNNING, step=1)
    rd.node.flush()
    RunDir(tmp_path / "run").clear_statuses()
    assert RunDir(tmp_path / "run").rank_statuses() == {}


def test_a_script_s_progress_goes_through_the_node_its_worker_opened(tmp_path: Path) -> None:
    worker = _rank(tmp_path / "run", tmp_path / "shm", local_ranks=1)
    assert worker.node is not None
    environ = {nodes.NODE_DIR_VARIABLE: str(worker.node.folder)}
    script = RunDir(worker.path, node=NodeChannel.from_environ(worker.path, worker.node_summary, environ))
    script.write_progress(0, Progress(first_step=1, first_time=1.0, step=6, time=3.0, stop_agreed=True))
    assert worker.progress_record(0).step == 6 and not worker.progress(0).exists()
    assert NodeChannel.from_environ(worker.path, worker.node_summary, {}) is None


def _wait(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out")
        time.sleep(0.05)


def test_jobs_status_says_when_each_silent_node_was_last_heard(tmp_path: Path) -> None:
    from hpc_train.core.files import write_json_atomic
    from hpc_train.core.records import RankStatus
    from hpc_train.tools.jobs import nodes_heard

    rd = RunDir(tmp_path / "run")
    now = 1_000_000.0

    def node(host: str, heard: float, state: RankState, ranks: range) -> None:
        statuses = tuple(RankStatus(rank=r, state=state, host=host, time=heard - 1, step=40) for r in ranks)
        summary = NodeSummary(host=host, time=heard, ranks=statuses)
        write_json_atomic(rd.node_summary(host), summary.to_json())

    node("n1", now - 4, RankState.RUNNING, range(0, 4))
    node("n2", now - 95, RankState.RUNNING, range(4, 8))  # died 95 s ago
    node("n3", now - 90, RankState.COMPLETED, range(8, 12))  # ended, and said so
    for i in range(4, 11):  # seven more dead nodes
        node(f"m{i}", now - 200, RankState.RUNNING, range(12 + 4 * i, 16 + 4 * i))
    lines = nodes_heard(rd, now)
    assert lines[0] == f"{rd.path}: 9 nodes, last heard 4-200 s ago"
    assert lines[1].startswith("m10: silent, last heard 200 s ago (")
    assert lines[1].endswith("; ranks 52-55 were running at step 40")
    assert len(lines) == 7 and lines[-1] == "and 3 more silent nodes: m[8-9],n2"  # the longest silent first
    assert not any(line.startswith(("n1", "n3")) for line in lines)
    assert nodes_heard(RunDir(tmp_path / "none"), now) == []


def test_a_last_word_that_cannot_reach_the_summary_gets_a_file_of_its_own(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A rank stopped (SIGSTOP) in the middle of a flush holds the node's lock: the others' ends are not lost."""
    import fcntl
    import os

    monkeypatch.setattr(nodes, "LOCK_WAIT_S", 0.2)
    rd = _rank(tmp_path / "run", tmp_path / "shm")
    assert rd.node is not None
    fd = os.open(rd.node.folder / ".flush.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        rd.write_status(1, RankState.COMPLETED, step=8)
    finally:
        os.close(fd)
    assert json.loads(rd.status_path(1).read_text())["state"] == "completed"
    assert RunDir(tmp_path / "run").rank_statuses()[1].step == 8


def test_a_node_folder_that_fails_sends_the_rank_s_records_to_the_run_dir(tmp_path: Path) -> None:
    """/dev/shm full or gone under a running rank: nothing is lost, the rank writes its own files."""
    rd = _rank(tmp_path / "run", tmp_path / "shm")
    assert rd.node is not None
    rd.node.folder.rmdir()
    rd.node.folder.write_text("not a folder")  # (root ignores file modes: a file where the folder was fails)
    rd.write_status(0, RankState.RUNNING, step=3)
    rd.write_progress(0, Progress(first_step=1, first_time=1.0, step=3, time=2.0))
    assert json.loads(rd.status_path(0).read_text())["step"] == 3
    assert json.loads(rd.progress(0).read_text())["step"] == 3


def test_no_node_folder_at_all_means_the_rank_writes_its_own_files(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "shm").write_text("not a folder")
    monkeypatch.setattr(nodes, "node_base", lambda: tmp_path / "shm")
    rd = RunDir(tmp_path / "run").with_node(job="1.0.0", local_ranks=1)
    assert rd.node is None
    rd.write_status(0, RankState.STARTING)
    assert rd.status_path(0).is_file()
