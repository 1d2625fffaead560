"""One owner per run dir (hpc_train.core.owner): the lease, how its owner is judged, and takeovers that race."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpc_train.config import Config
from hpc_train.core import owner
from hpc_train.core.errors import ConfigError
from hpc_train.core.records import LeaseRecord, LeaseWatcher
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import process_start
from hpc_train.launch import finished_step, write_config

from ..conftest import REPO
from .test_config import composed


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not this one: the owner of a lease in these tests."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def lease_of(pid: int, start: int | None = None, **changes: Any) -> LeaseRecord:
    """A lease record as another launcher on this host would write it."""
    now = time.time()
    record = LeaseRecord(
        token=f"other-{pid}",
        kind="process",
        launcher="local",
        host=socket.gethostname(),
        user="alice",
        pid=pid,
        pid_start=start if start is not None else process_start(pid),
        since=now - 60,
        heartbeat=now,
    )
    return replace(record, **changes)


def write_lease(run_dir: Path, record: LeaseRecord | dict[str, Any]) -> None:
    """Write ``record`` as the lease (a dict: as it stands, whatever its values)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / owner.LEASE_FILE).write_text(json.dumps(record.to_json() if isinstance(record, LeaseRecord) else record))


def read_lease(run_dir: Path) -> LeaseRecord:
    return LeaseRecord.from_json(json.loads((run_dir / owner.LEASE_FILE).read_text()))


def test_claim_records_the_owner_and_release_gives_it_back(tmp_path: Path) -> None:
    with owner.claim(tmp_path, "local") as lease:
        record = read_lease(tmp_path)
        assert (record.host, record.pid, record.pid_start) == (
            socket.gethostname(),
            os.getpid(),
            process_start(os.getpid()),
        )
        assert record.token == lease.token and record.since is not None and record.since <= time.time()
        assert owner.held(tmp_path) is lease
        owner.check_free(tmp_path)  # this process's own lease: free for it
    assert not (tmp_path / owner.LEASE_FILE).exists()
    assert owner.held(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp file or guard left behind


def test_a_live_owner_on_this_host_is_refused_by_name_and_nothing_is_written(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    write_lease(tmp_path, lease_of(sleeper.pid))
    before = (tmp_path / owner.LEASE_FILE).read_bytes()
    with pytest.raises(ConfigError) as refused:
        owner.claim(tmp_path, "local")
    message = str(refused.value)
    assert f"hydra.run.dir={tmp_path} is in use by the cluster=local launcher pid {sleeper.pid}" in message
    assert f"on {socket.gethostname()} (alice), running since " in message
    assert f"HINT: wait for it to end; stop it with `python -m hpc_train.jobs cancel {tmp_path}`" in message
    assert "another hydra.run.dir" in message
    assert (tmp_path / owner.LEASE_FILE).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [owner.LEASE_FILE]
    with pytest.raises(ConfigError, match=f"launcher pid {sleeper.pid}"):
        owner.check_free(tmp_path)


def test_a_dead_owner_is_taken_over(tmp_path: Path) -> None:
    write_lease(tmp_path, lease_of(dead_pid(), start=12345))
    assert owner.current_owner(tmp_path) is None
    with owner.claim(tmp_path, "local") as lease:
        assert read_lease(tmp_path).token == lease.token
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_reused_pid_is_another_process(tmp_path: Path) -> None:
    """The pid runs (it is this very test), but it started at another time than the lease says: a new process
    that was given the dead owner's pid."""
    write_lease(tmp_path, lease_of(os.getpid(), start=(process_start(os.getpid()) or 0) - 1))
    with owner.claim(tmp_path, "local") as lease:
        assert read_lease(tmp_path).token == lease.token


def test_the_watcher_of_a_dead_launcher_keeps_the_run_dir(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """A killed local launcher's watcher is still stopping the ranks: the run dir is not free yet."""
    watcher = LeaseWatcher(pid=sleeper.pid, pid_start=process_start(sleeper.pid))
    write_lease(tmp_path, lease_of(dead_pid(), start=1, watcher=watcher))
    with pytest.raises(ConfigError, match=f"its watcher pid {sleeper.pid} is stopping the ranks"):
        owner.claim(tmp_path, "local")


def test_another_hosts_launcher_is_live_while_its_heartbeat_is_fresh(tmp_path: Path) -> None:
    write_lease(tmp_path, lease_of(1, host="node7", heartbeat=time.time() - 40))
    with pytest.raises(ConfigError, match=r"on node7 .*last heartbeat was 40s ago; a lease without one for 300s"):
        owner.claim(tmp_path, "local")
    write_lease(tmp_path, lease_of(1, host="node7", heartbeat=time.time() - owner.STALE_S - 1))
    with owner.claim(tmp_path, "local") as lease:
        assert read_lease(tmp_path).token == lease.token


def test_a_launcher_in_an_allocation_is_gone_once_slurm_requeued_or_ended_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster.submit=here in a batch script of one's own: after a requeue the script runs again, maybe on
    another node, while the lease of its killed first run still has a fresh heartbeat."""
    write_lease(tmp_path, lease_of(1, host="node7", launcher="slurm submit=here", allocation="77", requeue=0))
    with pytest.raises(ConfigError, match="in Slurm allocation 77, running since"):
        owner.claim(tmp_path, "slurm submit=here", probe=lambda job: (True, "RUNNING per squeue"))
    with owner.claim(tmp_path, "slurm submit=here", probe=lambda job: (False, "COMPLETED per squeue")):
        pass
    write_lease(tmp_path, lease_of(1, host="node7", launcher="slurm submit=here", allocation="77", requeue=0))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with owner.claim(tmp_path, "slurm submit=here", probe=lambda job: (True, "RUNNING per squeue")):
        pass


def test_the_heartbeat_keeps_the_lease_fresh_and_stops_when_it_was_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lease = owner.claim(tmp_path, "local", heartbeat=False)
    first = read_lease(tmp_path).heartbeat
    lease.start_heartbeat(every_s=0.02)
    deadline = time.monotonic() + 2
    while read_lease(tmp_path).heartbeat == first:
        assert time.monotonic() < deadline, "no heartbeat"
        time.sleep(0.01)
    write_lease(tmp_path, lease_of(1, host="node7"))  # another host judged this launcher dead and took over
    assert lease._beat is not None
    lease._beat.join(timeout=2)
    assert not lease._beat.is_alive()
    assert "no longer names this launcher" in capsys.readouterr().err
    lease.release()  # not ours any more: left alone
    assert read_lease(tmp_path).host == "node7"


def test_a_slurm_job_owns_the_run_dir_until_it_ends(tmp_path: Path) -> None:
    """Handed to its job, the lease outlives the launcher and is judged by Slurm's view of the job id."""
    lease = owner.claim(tmp_path, "slurm")
    lease.hand_to_job("4242_3")
    lease.release()  # handed: the launcher's exit leaves it to the job
    record = read_lease(tmp_path)
    assert (record.kind, record.job_id, record.pid) == ("slurm", "4242_3", os.getpid())
    asked: list[str] = []

    def probe(state: tuple[bool | None, str]) -> owner.JobProbe:
        return lambda job_id: (asked.append(job_id), state)[1]

    with pytest.raises(ConfigError, match=r"in use by Slurm job 4242_3 \(REQUEUED per squeue\), submitted by "):
        owner.claim(tmp_path, "slurm", probe=probe((True, "REQUEUED per squeue")))
    with pytest.raises(ConfigError, match=f"if you know it has ended, delete {tmp_path / owner.LEASE_FILE}"):
        owner.claim(tmp_path, "slurm", probe=probe((None, "squeue could not reach slurmctld")))
    with owner.claim(tmp_path, "slurm", probe=probe((False, "COMPLETED per squeue"))) as taken:
        assert read_lease(tmp_path).token == taken.token
    assert asked == ["4242_3"] * 3


def test_live_ranks_of_a_launch_without_lease_are_refused(tmp_path: Path) -> None:
    """Ranks still marked running whose processes run (a launch from before leases, or a lease deleted by hand)."""
    RunDir(tmp_path).write_status(1, "running", step=3)
    with pytest.raises(ConfigError, match=rf"in use by processes of an earlier launch \(rank 1 pid {os.getpid()}\)"):
        owner.claim(tmp_path, "local")
    assert not (tmp_path / owner.LEASE_FILE).exists()


def test_a_late_takeover_of_a_lease_already_replaced_changes_nothing(tmp_path: Path) -> None:
    """Two launchers judged the same lease dead; the first replaced it. The second, late, even after the first
    one's guard is gone, must find the lease changed and replace nothing."""
    path = tmp_path / owner.LEASE_FILE
    write_lease(tmp_path, lease_of(dead_pid(), start=1))
    stale = path.read_bytes()
    assert owner._swap(path, stale, b'{"token": "first"}')
    assert not owner._swap(path, stale, b'{"token": "second"}')
    assert path.read_bytes() == b'{"token": "first"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [owner.LEASE_FILE]


def test_a_guard_left_by_a_dead_claimant_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / owner.LEASE_FILE
    write_lease(tmp_path, lease_of(dead_pid(), start=1))
    stale = path.read_bytes()
    guard = owner._guard(path, stale)
    guard.write_bytes(b'{"token": "crashed"}')  # a claimant died between taking the guard and replacing
    assert not owner._swap(path, stale, b'{"token": "mine"}')  # a fresh guard: someone is at it, look again
    old = time.time() - owner.GUARD_STALE_S - 1
    os.utime(guard, (old, old))
    assert owner._swap(path, stale, b'{"token": "mine"}')
    assert path.read_bytes() == b'{"token": "mine"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [owner.LEASE_FILE]


OLD_LEASES = [  # byte for byte as launchers before LeaseRecord wrote them (json.dumps(dict, indent=1, sort_keys=True))
    pytest.param(
        """{
 "heartbeat": 1767225630.5,
 "host": "node7",
 "kind": "process",
 "launcher": "local",
 "pid": 4321,
 "pid_start": 987654,
 "run_dir": "/scratch/alice/runs/7",
 "since": 1767225600.0,
 "token": "0f4c2b9e8d7a6f5e4d3c2b1a09f8e7d6",
 "user": "alice",
 "watcher": {
  "pid": 4400,
  "pid_start": null
 }
}""",
        id="local-with-watcher",
    ),
    pytest.param(
        """{
 "allocation": "77",
 "heartbeat": 1767225630.5,
 "host": "node7",
 "kind": "process",
 "launcher": "slurm submit=here",
 "pid": 4321,
 "pid_start": null,
 "queue": "gpu",
 "restart": 0,
 "run_dir": "/scratch/alice/runs/7",
 "since": 1767225600.0,
 "token": "0f4c2b9e8d7a6f5e4d3c2b1a09f8e7d6",
 "user": "alice"
}""",
        id="submit-here-with-a-fact-of-its-own",
    ),
    pytest.param(
        """{
 "handed": 1767225601.75,
 "heartbeat": 1767225600.0,
 "host": "login1",
 "job_id": "4242_3",
 "kind": "slurm",
 "launcher": "slurm",
 "pid": 4321,
 "pid_start": 987654,
 "run_dir": "/scratch/alice/runs/7",
 "since": 1767225600.0,
 "token": "0f4c2b9e8d7a6f5e4d3c2b1a09f8e7d6",
 "user": "alice"
}""",
        id="handed-to-a-slurm-job",
    ),
]


@pytest.mark.parametrize("text", OLD_LEASES)
def test_a_lease_an_older_launcher_wrote_reads_and_writes_back_the_same(tmp_path: Path, text: str) -> None:
    write_lease(tmp_path, json.loads(text))
    record = owner._decode(text.encode())
    assert record is not None and record == read_lease(tmp_path)  # nothing in it is damaged
    assert (record.token, record.user, record.pid, record.since) == (
        "0f4c2b9e8d7a6f5e4d3c2b1a09f8e7d6",
        "alice",
        4321,
        1767225600.0,
    )
    written = json.loads(text)
    if "restart" in written:  # Slurm's restart count, read as ``requeue`` now (its name in every record)
        written["requeue"] = written.pop("restart")
    assert record.to_json() == written
    assert owner._encode(record) == json.dumps(written, indent=1, sort_keys=True).encode()


def test_an_older_lease_is_read_into_its_fields() -> None:
    local, here, handed = (owner._decode(param.values[0].encode()) for param in OLD_LEASES)
    assert local is not None and local.watcher == LeaseWatcher(pid=4400, pid_start=None) and local.extra == {}
    assert here is not None and (here.allocation, here.requeue, here.pid_start, here.extra) == (
        "77",
        0,
        None,
        {"queue": "gpu"},
    )
    assert handed is not None and (handed.kind, handed.job_id, handed.handed) == ("slurm", "4242_3", 1767225601.75)
    assert owner.Owner(handed, True, "RUNNING per squeue").job_id == "4242_3"


def test_the_lease_holds_the_keys_and_value_types_older_launchers_read(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """What a launcher writes is read by older ones: the same keys, with values of the same types, but for Slurm's
    restart count, now ``requeue`` as in every record (an older launcher that finds no ``restart`` asks Slurm
    whether the allocation still runs); a fact the record does not name is kept through every rewrite."""
    facts = {"allocation": "77", "requeue": 0, "queue": "gpu", "partition": None}
    lease = owner.claim(tmp_path, "slurm submit=here", heartbeat=False, facts=facts)
    first = json.loads((tmp_path / owner.LEASE_FILE).read_text())
    assert {key: type(value) for key, value in first.items()} == {
        "token": str,
        "kind": str,
        "launcher": str,
        "run_dir": str,
        "host": str,
        "user": str,
        "pid": int,
        "pid_start": int,
        "since": float,
        "heartbeat": float,
        "allocation": str,
        "requeue": int,
        "queue": str,
    }
    assert (first["kind"], first["launcher"], first["run_dir"]) == ("process", "slurm submit=here", str(tmp_path))
    lease.add_watcher(sleeper.pid)
    lease.hand_to_job("4242")
    last = json.loads((tmp_path / owner.LEASE_FILE).read_text())
    assert last["watcher"] == {"pid": sleeper.pid, "pid_start": process_start(sleeper.pid)}
    assert (last["kind"], last["job_id"], type(last["handed"])) == ("slurm", "4242", float)
    assert {k: v for k, v in last.items() if k not in ("watcher", "kind", "job_id", "handed")} == {
        k: v for k, v in first.items() if k != "kind"
    }


DAMAGED = [  # what is wrong with a lease of the live sleeper (given its pid), and whether its owner still counts as live
    pytest.param(lambda pid: {"pid": str(pid)}, False, id="pid-a-string"),
    pytest.param(lambda pid: {"pid": True}, False, id="pid-true"),
    pytest.param(lambda pid: {"pid_start": "yesterday"}, False, id="pid_start-a-string"),
    pytest.param(lambda pid: {"pid_start": [process_start(pid)]}, False, id="pid_start-a-list"),
    pytest.param(lambda pid: {"pid": dead_pid(), "watcher": 7}, False, id="watcher-no-object"),
    pytest.param(
        lambda pid: {"pid": dead_pid(), "watcher": {"pid": pid, "pid_start": "x"}},
        False,
        id="watcher-pid_start-a-string",
    ),
    pytest.param(lambda pid: {"host": "node7", "heartbeat": "just now"}, False, id="heartbeat-a-string"),
    pytest.param(lambda pid: {"host": "node7", "heartbeat": None}, False, id="heartbeat-null"),
    pytest.param(lambda pid: {"kind": 5}, True, id="kind-a-number"),
    pytest.param(lambda pid: {"host": 7}, True, id="host-a-number-fresh-heartbeat"),
    pytest.param(lambda pid: {"user": ["alice"], "since": "monday", "launcher": None}, True, id="what-is-only-shown"),
]


@pytest.mark.parametrize(("damage", "live"), DAMAGED)
def test_a_value_of_the_wrong_type_counts_as_absent(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], damage: Any, live: bool
) -> None:
    """As launchers have always judged a lease: a process named by a pid or start time of the wrong type is not
    running, a heartbeat of the wrong type is none; the other keys are judged as they are."""
    write_lease(tmp_path, {**lease_of(sleeper.pid).to_json(), **damage(sleeper.pid)})
    if live:
        assert owner.current_owner(tmp_path) is not None
        with pytest.raises(ConfigError, match=f"launcher pid {sleeper.pid} on "):
            owner.claim(tmp_path, "local")
    else:
        assert owner.current_owner(tmp_path) is None
        with owner.claim(tmp_path, "local") as lease:
            assert read_lease(tmp_path).token == lease.token


def test_a_job_id_or_allocation_written_as_a_number_is_asked_about_as_text(tmp_path: Path) -> None:
    asked: list[str] = []

    def running(job_id: str) -> tuple[bool | None, str]:
        asked.append(job_id)
        return True, "RUNNING per squeue"

    write_lease(tmp_path, {**lease_of(1).to_json(), "kind": "slurm", "job_id": 4242, "token": 5})
    with pytest.raises(ConfigError, match=r"in use by Slurm job 4242 \(RUNNING per squeue\)"):
        owner.claim(tmp_path, "local", probe=running)
    assert not owner.release_token(tmp_path, "5")  # a token of the wrong type names no claim
    write_lease(tmp_path, {**lease_of(1, host="node7").to_json(), "allocation": 77})
    with pytest.raises(ConfigError, match="in Slurm allocation 77, running since"):
        owner.claim(tmp_path, "local", probe=running)
    assert asked == ["4242", "77"]


@pytest.mark.parametrize("data", [b"{", b"", b"\xff\xfe", b"[1, 2]", b"null", b'"owner"', b"{}"])
def test_a_lease_that_is_no_json_object_is_none(tmp_path: Path, data: bytes) -> None:
    (tmp_path / owner.LEASE_FILE).write_bytes(data)
    assert owner._decode(data) is None and owner.current_owner(tmp_path) is None
    owner.check_free(tmp_path)
    assert not owner.release_token(tmp_path, "any")
    with owner.claim(tmp_path, "local") as lease:
        assert read_lease(tmp_path).token == lease.token


RACER = """
import sys, time
from pathlib import Path
from hpc_train.config import Config
from hpc_train.core import owner
from hpc_train.core.errors import ConfigError
run_dir, go = Path(sys.argv[1]), Path(sys.argv[2])
judge = owner._judge
def slow_judge(*args):
    verdict = judge(*args)
    time.sleep(0.1)  # judging takes time (squeue...): every racer has judged the dead lease before any replaces it
    return verdict
owner._judge = slow_judge
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
try:
    owner.claim(run_dir, "local", heartbeat=False)
    print("won", flush=True)
except ConfigError as exc:
    print("refused", exc, flush=True)
sys.stdin.read()  # stay alive (a live owner) until every racer has answered
"""


def test_racing_takeovers_of_a_dead_lease_have_exactly_one_winner(tmp_path: Path) -> None:
    run_dir, go = tmp_path / "run", tmp_path / "go"
    write_lease(run_dir, lease_of(dead_pid(), start=1))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(run_dir), str(go)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(4)
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        go.touch()  # all of them at once at the same dead lease
        answers = [racer.stdout.readline() for racer in racers if racer.stdout is not None]
        winner = read_lease(run_dir).pid
    finally:
        for racer in racers:
            racer.communicate("", timeout=10)
    assert sum(a.startswith("won") for a in answers) == 1, answers
    refusals = [a for a in answers if a.startswith("refused")]
    assert len(refusals) == 3 and all(f"launcher pid {winner} on" in a for a in refusals), answers
    assert sorted(p.name for p in run_dir.iterdir()) == [owner.LEASE_FILE]


def test_write_config_refuses_a_run_dir_another_launch_owns(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """A Slurm sweep writes each element's config before submitting: it must not write into a live run."""
    write_lease(tmp_path, lease_of(sleeper.pid))
    with pytest.raises(ConfigError, match=f"launcher pid {sleeper.pid}"):
        write_config(composed(), RunDir(tmp_path))
    assert not RunDir(tmp_path).config.exists()


def test_a_finished_run_is_told_apart_from_one_with_more_to_train(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    cfg = composed("trainer.max_steps=10")
    write_config(cfg, run_dir)
    run_dir.model_final.write_bytes(b"weights")
    run_dir.checkpoint(10).parent.mkdir()
    run_dir.checkpoint(10).write_bytes(b"checkpoint")
    for rank in (0, 1):
        run_dir.write_status(rank, "completed", step=10)

    def changed(trainer: dict[str, Any] | None = None, **cluster: Any) -> Config:
        return replace(cfg, trainer=replace(cfg.trainer, **(trainer or {})), cluster=replace(cfg.cluster, **cluster))

    assert finished_step(cfg, run_dir) == 10
    assert finished_step(changed(failure_grace_s=9.0, timeout_min=5.0), run_dir) == 10  # trains no further
    assert finished_step(changed({"max_steps": 20}), run_dir) is None  # train longer
    assert finished_step(changed({"max_epochs": 1}), run_dir) is None
    assert finished_step(changed({"lr": 0.5}), run_dir) is None  # write_config refuses it, naming the key
    run_dir.write_status(1, "stopped", step=10)
    assert finished_step(cfg, run_dir) is None  # a rank did not complete
    run_dir.write_status(1, "completed", step=10)
    run_dir.checkpoint(10).unlink()
    assert finished_step(cfg, run_dir) is None  # no checkpoint of the last step to be sure of it
