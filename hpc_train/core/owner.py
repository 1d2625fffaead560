"""One owner per run directory: the lease in ``<run dir>/owner.json``.

Two launches into one run dir would both resume from the same checkpoint and both write its checkpoints,
metrics and statuses: the first one's later metrics rows are lost and neither run is what it says. So a launcher
first claims the run dir, and a second launch is refused, naming the owner, until that owner is gone.

The lease names its owner so that any launcher, on any host, can judge whether it is still alive:

- a launcher process (``cluster=local``, ``debug``, ``cluster.slurm.submit=here``, or a Slurm submission under way):
  host, pid and the pid's start time (a pid is reused, a (pid, start) pair is not), and a heartbeat the launcher
  rewrites every ``HEARTBEAT_S``. On the same host the process is checked; from another host, where its pid
  means nothing, the lease is live while its heartbeat is younger than ``STALE_S``. A local launcher also names
  its watcher, the process that stops the ranks when the launcher is killed: the lease stays live until the
  ranks are gone.
- a Slurm job (once submitted): the job id. The job is the owner while Slurm says it has not ended (pending,
  running, requeued, ...), and a requeue keeps the same job id, so a requeued job keeps its run dir. Slurm is
  asked through the ``JobProbe`` the caller passes (this module sits below the launchers and cannot ask it
  itself).

A run dir without a (live) lease whose rank statuses name live rank processes on this host (a launch by an
older version, or a lease deleted by hand) is refused too.

Taking the lease is atomic on a local file system and on NFS, without file locks (which NFS mounts with
``nolock`` and Lustre without ``-o flock`` do not share between hosts): the record is written to a temp file
that is then ``link()``-ed to ``owner.json``, which fails when the name exists. A dead owner's lease is taken
over under a guard file named after the exact bytes the claimant judged dead, created the same way: of any
number of launchers racing to take over one dead lease, exactly one creates the guard, checks that the lease
still holds those bytes and replaces it; the others see a live lease when they look again.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write
from hpc_train.core.identity import JobIdentity
from hpc_train.core.records import LeaseRecord, LeaseWatcher
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import is_live, pid_alive, process_start, rank_process_alive

__all__ = [
    "HEARTBEAT_S",
    "LEASE_FILE",
    "STALE_S",
    "JobProbe",
    "Lease",
    "Owner",
    "check_free",
    "claim",
    "current_owner",
    "held",
    "release_token",
]

LEASE_FILE = "owner.json"
HEARTBEAT_S = 30.0
"""How often a launcher rewrites its lease's heartbeat."""
STALE_S = 300.0
"""A launcher on another host whose lease has had no heartbeat for this long is taken as dead. Ten heartbeats:
NFS clients may cache a directory for up to a minute (acdirmax) and hosts' clocks drift by seconds."""
GUARD_STALE_S = 60.0
"""A takeover guard this old was left by a claimant that died while holding it (it is held for milliseconds)."""
_CLAIM_TRIES = 20

JobProbe = Callable[[str], "tuple[bool | None, str]"]
"""Slurm's view of a job id: (True, state) while it has not ended, (False, state) once it has, (None, why) when
Slurm cannot tell (squeue missing or not answering)."""

_HELD: dict[str, Lease] = {}
"""The leases this process holds, by resolved run dir."""
_HELD_LOCK = threading.Lock()


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def _lease_path(run_dir: Path) -> Path:
    return Path(run_dir) / LEASE_FILE


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(stamp))) if stamp is not None else "?"


def _said(value: object) -> str:
    return "?" if value is None else str(value)


# ---- the owner, as a lease describes it ------------------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """A lease's record and what was concluded about it."""

    record: LeaseRecord
    live: bool | None
    """True: the owner runs; False: it is gone (the lease may be taken over); None: it cannot be told."""
    why: str
    """What the verdict rests on, in words."""

    @property
    def job_id(self) -> str | None:
        job = self.record.job_id
        return job if job and self.record.kind == "slurm" else None

    def describe(self) -> str:
        """Who owns the run dir, since when, and why that owner counts as live."""
        rec = self.record
        who = f"{_said(rec.user)} from {_said(rec.host)}"
        if self.job_id:
            return f"Slurm job {self.job_id} ({self.why}), submitted by {who} at {_when(rec.since)}"
        launcher = rec.launcher if rec.launcher is not None else "local"
        allocation = f" in Slurm allocation {rec.allocation}" if rec.allocation else ""
        return (
            f"the cluster={launcher} launcher pid {_said(rec.pid)} on {_said(rec.host)} ({_said(rec.user)})"
            f"{allocation}, running since {_when(rec.since)} ({self.why})"
        )


def _process_runs(pid: int | None, start: int | None) -> bool:
    """The process (pid, start time) still runs on this host; a reused pid (another start time) does not count."""
    return pid is not None and pid > 0 and pid_alive(pid) and (start is None or process_start(pid) == start)


def _judge(record: LeaseRecord, probe: JobProbe | None) -> Owner:
    """Whether the owner a lease names is still alive."""
    if record.kind == "slurm":
        if probe is None:
            return Owner(record, None, "Slurm was not asked")
        active, state = probe(str(record.job_id))
        return Owner(record, active, state)
    if record.host == socket.gethostname():
        if _process_runs(record.pid, record.pid_start):
            return Owner(record, True, "the process runs")
        watcher = record.watcher
        if watcher is not None and _process_runs(watcher.pid, watcher.pid_start):
            why = f"the launcher is gone; its watcher pid {watcher.pid} is stopping the ranks"
            return Owner(record, True, why)
        return Owner(record, False, "the process is gone")
    allocation = record.allocation
    if allocation:  # cluster.slurm.submit=here: a launcher inside a Slurm allocation, maybe a batch script of one's own
        here, recorded = JobIdentity.from_environ(), record.requeue
        if here.job_id == allocation and recorded is not None and here.requeues > recorded:
            return Owner(record, False, f"Slurm requeued allocation {allocation} since, ending that launcher")
        if probe is not None and probe(allocation)[0] is False:
            return Owner(record, False, f"its allocation {allocation} has ended")
    beat = record.heartbeat
    age = time.time() - float(beat) if beat is not None else float("inf")
    heard = f"its last heartbeat was {age:.0f}s ago; a lease without one for {STALE_S:.0f}s is taken as dead"
    return Owner(record, age < STALE_S, heard)


# ---- atomic file steps --------------------------------------------------------------------------------------------


def _encode(record: LeaseRecord) -> bytes:
    return json.dumps(record.to_json(), indent=1, sort_keys=True).encode()


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _decode(data: bytes | None) -> LeaseRecord | None:
    """The lease in ``data``; None when there is none to judge (no file, not JSON, no or an empty JSON object).
    A value of the wrong type counts as absent."""
    try:
        found = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return LeaseRecord.salvage(found)[0] if isinstance(found, dict) and found else None


def _token_at(path: Path) -> str | None:
    """The token of the lease at ``path`` (None when there is none)."""
    record = _decode(_read_bytes(path))
    return record.token if record is not None else None


def _create(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless the name exists; True when this call created it.

    The data is complete in a temp file before ``link()`` gives it the name, so a reader never sees half a lease.
    Over NFS a link whose reply was lost may report failure after it succeeded: the temp file's link count (2
    once the name points to it) is what decides, as liblockfile does."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    try:
        with contextlib.suppress(OSError):
            os.link(tmp, path)
        return os.stat(tmp).st_nlink == 2
    finally:
        tmp.unlink(missing_ok=True)


def _replace(path: Path, data: bytes, durable: bool = True) -> None:
    atomic_write(path, lambda f: f.write(data), durable=durable)


def _guard(path: Path, seen: bytes) -> Path:
    return path.with_name(f".{path.name}.takeover-{hashlib.sha1(seen).hexdigest()[:16]}")


def _abandoned(guard: Path) -> bool:
    try:
        return time.time() - guard.stat().st_mtime > GUARD_STALE_S
    except OSError:
        return False


def _swap(path: Path, seen: bytes, mine: bytes, depth: int = 0) -> bool:
    """Replace ``path``, which held ``seen`` (a dead owner's lease), by ``mine``; False when another claimant
    took it first or it changed meanwhile (look again).

    The guard file, named after ``seen``, admits one claimant at a time; inside it the lease is checked to
    still hold ``seen`` before it is replaced, so a claimant that comes late, even after the guard is gone, finds
    the new lease and replaces nothing. A guard left by a claimant that died holding it is itself taken over the
    same way (a guard on the guard), after ``GUARD_STALE_S``."""
    guard = _guard(path, seen)
    if not _create(guard, mine):
        held = _read_bytes(guard)
        if held is None or depth >= 3 or not _abandoned(guard) or not _swap(guard, held, mine, depth + 1):
            return False
    try:
        if _read_bytes(path) != seen:
            return False
        _replace(path, mine)
        return True
    finally:
        if _read_bytes(guard) == mine:
            guard.unlink(missing_ok=True)


# ---- the lease -------------------------------------------------------------------------------------------------------


class Lease:
    """This process's claim on a run dir: keeps the heartbeat going, hands the run dir to a Slurm job, gives it
    back. As a context manager it is released on exit (unless it was handed to a job)."""

    def __init__(self, run_dir: Path, record: LeaseRecord) -> None:
        self.run_dir = Path(run_dir)
        self.record = record
        self.handed = False
        self.released = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return _lease_path(self.run_dir)

    @property
    def token(self) -> str:
        return self.record.token or ""

    @property
    def active(self) -> bool:
        return not (self.handed or self.released)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _update(self, change: Callable[[LeaseRecord], LeaseRecord], durable: bool = True) -> bool:
        """Rewrite the lease as ``change`` makes it if it is still ours; False when another launch has replaced it
        (it judged this one dead: a host without heartbeats for STALE_S, or a lease removed by hand)."""
        with self._lock:
            if not self.active or _token_at(self.path) != self.token:
                return False
            self.record = change(self.record)
            _replace(self.path, _encode(self.record), durable=durable)
            return True

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> None:
        """Rewrite the heartbeat every ``every_s`` in a daemon thread, so that launchers on other hosts can tell
        this launcher from a dead one."""
        if self._beat is None:
            self._beat = threading.Thread(target=self._heartbeat, args=(every_s,), name="hpc_train-lease", daemon=True)
            self._beat.start()

    def _heartbeat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                kept = self._update(lambda record: replace(record, heartbeat=time.time()), durable=False)
            except OSError:
                continue  # a file system hiccup: the next beat tries again
            if not kept:
                if self.active:
                    print(
                        f"hpc_train: warning: {self.path} no longer names this launcher (pid {os.getpid()}): another "
                        "launch took the run dir over. Both may now write to it.",
                        file=sys.stderr,
                        flush=True,
                    )
                return

    def add_watcher(self, pid: int) -> None:
        """Name the process that stops the ranks if this launcher dies: the lease is live while it runs."""
        watcher = LeaseWatcher(pid=pid, pid_start=process_start(pid))
        self._update(lambda record: replace(record, watcher=watcher))

    def hand_to_job(self, job_id: str) -> None:
        """The run dir now belongs to Slurm job ``job_id``: live while Slurm says the job has not ended, through
        requeues. This process no longer releases it."""
        self._update(lambda record: replace(record, kind="slurm", job_id=str(job_id), handed=time.time()))
        self._finish(handed=True)

    def release(self) -> None:
        """Give the run dir back (a launch ended: success, failure or Ctrl-C); nothing when it was handed to a
        Slurm job, or when the lease no longer names this launcher."""
        with self._lock:
            if self.active and _token_at(self.path) == self.token:
                self.path.unlink(missing_ok=True)
        self._finish(handed=False)

    def _finish(self, handed: bool) -> None:
        self._stop.set()
        with self._lock:
            if self.active:
                self.handed, self.released = handed, not handed
        with _HELD_LOCK:
            if _HELD.get(_key(self.run_dir)) is self:
                del _HELD[_key(self.run_dir)]


def _new_record(run_dir: Path, launcher: str, facts: Mapping[str, Any]) -> LeaseRecord:
    """This launcher's lease, with ``facts`` (keys of the lease, or others kept as they are) where not None."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    now = time.time()
    record = LeaseRecord(
        token=uuid.uuid4().hex,
        kind="process",
        launcher=launcher,
        run_dir=str(run_dir),
        host=socket.gethostname(),
        user=user,
        pid=os.getpid(),
        pid_start=process_start(os.getpid()),
        since=now,
        heartbeat=now,
    )
    given = {k: v for k, v in facts.items() if v is not None}
    return LeaseRecord.from_json({**record.to_json(), **given}) if given else record


def _live_ranks(run_dir: Path) -> list[str]:
    """Ranks on this host still marked live whose processes run: those of a launch that left no lease (an older
    version, or a lease removed by hand), or whose launcher and watcher are both gone."""
    statuses = RunDir(run_dir).rank_statuses()
    return [
        f"rank {rank} pid {s.pid}"
        for rank, s in sorted(statuses.items())
        if is_live(s) and rank_process_alive(s) is True
    ]


def _refusal(run_dir: Path, owner: Owner | None, ranks: list[str]) -> ConfigError:
    who = owner.describe() if owner is not None else f"processes of an earlier launch ({', '.join(ranks)})"
    hints = [
        "wait for it to end",
        f"stop it with `python -m hpc_train.jobs cancel {run_dir}`",
        "or launch into another hydra.run.dir (leave it unset for a new one)",
    ]
    if owner is not None and owner.live is None:
        hints.append(f"if you know it has ended, delete {_lease_path(run_dir)}")
    return ConfigError(
        f"hydra.run.dir={run_dir} is in use by {who} (lease {_lease_path(run_dir)}). A second launch would train "
        f"over its checkpoints and metrics. HINT: {'; '.join(hints)}."
    )


def current_owner(run_dir: Path, probe: JobProbe | None = None) -> Owner | None:
    """The owner of ``run_dir`` that is alive or cannot be told dead; None when the run dir is free."""
    record = _decode(_read_bytes(_lease_path(run_dir)))
    if record is None:
        return None
    owner = _judge(record, probe)
    return None if owner.live is False else owner


def held(run_dir: Path) -> Lease | None:
    """The lease this process holds on ``run_dir``, if any."""
    with _HELD_LOCK:
        return _HELD.get(_key(run_dir))


def check_free(run_dir: Path, probe: JobProbe | None = None) -> None:
    """ConfigError naming the owner when another launch owns ``run_dir``; a lease this process holds is fine.
    A check, not a claim: ``claim`` is what makes sure of it."""
    lease = held(run_dir)
    if lease is not None and _token_at(_lease_path(run_dir)) == lease.token:
        return
    owner = current_owner(run_dir, probe)
    ranks = [] if owner is not None else _live_ranks(run_dir)
    if owner is not None or ranks:
        raise _refusal(Path(run_dir), owner, ranks)


def claim(
    run_dir: Path,
    launcher: str,
    probe: JobProbe | None = None,
    heartbeat: bool = True,
    facts: Mapping[str, Any] | None = None,
) -> Lease:
    """Take ``run_dir`` for this process, or raise ConfigError naming its live owner (nothing is written then).

    A dead owner's lease is taken over. ``launcher`` and ``facts`` (the allocation of cluster.slurm.submit=here, ...)
    are recorded to say who owns the run dir; ``probe`` asks Slurm about a job that owns it. ``heartbeat``:
    start the thread that keeps the lease fresh for launchers on other hosts."""
    run_dir = Path(run_dir)
    if held(run_dir) is not None:
        raise ConfigError(f"hydra.run.dir={run_dir} is claimed twice by this process (pid {os.getpid()})")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = _lease_path(run_dir)
    record = _new_record(run_dir, launcher, facts or {})
    mine = _encode(record)
    for _ in range(_CLAIM_TRIES):
        seen = _read_bytes(path)
        if seen is None:
            # Free: but ranks of a launch that left no lease may still write here.
            ranks = _live_ranks(run_dir)
            if ranks:
                raise _refusal(run_dir, None, ranks)
            won = _create(path, mine)
        else:
            found = _decode(seen)
            owner = _judge(found, probe) if found is not None else Owner(LeaseRecord(), False, "an unreadable lease")
            if owner.live is not False:
                raise _refusal(run_dir, owner, [])
            ranks = _live_ranks(run_dir)
            if ranks:
                raise _refusal(run_dir, None, ranks)
            won = _swap(path, seen, mine)
        if won:
            lease = Lease(run_dir, record)
            with _HELD_LOCK:
                _HELD[_key(run_dir)] = lease
            if heartbeat:
                lease.start_heartbeat()
            return lease
        time.sleep(0.01)  # another claimant got there first: judge what it wrote
    raise ConfigError(
        f"hydra.run.dir={run_dir}: could not take {path} in {_CLAIM_TRIES} tries; other launches keep claiming "
        "it. HINT: launch one run per run dir"
    )


def release_token(run_dir: Path, token: str) -> bool:
    """Remove the lease if it still holds ``token``: for the watcher of a launcher that died, once the ranks
    are gone. True when it was removed."""
    path = _lease_path(run_dir)
    if _token_at(path) != token:
        return False
    path.unlink(missing_ok=True)
    return True
