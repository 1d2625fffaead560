"""A node's ranks report to the run dir through their node: one summary file per node, not one file per rank.

Each rank writes its status and progress to a folder on the node itself (``/dev/shm``: memory, never a shared
file system), which costs the shared file system nothing. One rank of the node, its reporter, folds that folder
into ``status/node_<host>.json`` in the run dir: every ``NODE_EVERY_S`` while the node trains, within about
``SOON_S`` when a rank's state changes, and at once, by the rank itself, when a rank ends (it may be gone a moment
later). So in steady training the shared file system sees one atomic update (a create and a rename) per node per
10 s, whatever the number of ranks; a job of 1,024 nodes x 4 ranks whose ranks each rewrote a status every few
seconds sent some 800 metadata operations a second to the file system's metadata server.

Why files in node-local memory, rather than a socket to a node agent or the job's TCP store: every process of the
node, a user's script included, can write one without a server to start, find or outlive; the reporter role
passes to another rank through a lock the kernel releases when its holder dies; and the TCP store lives on one
host, so 4,096 ranks reporting to it is a fan-in to one process that the status does not need.

The summary says when the node was last heard (``NodeSummary.time``): it is rewritten every ``NODE_EVERY_S`` while
any rank of the node lives, so after a node dies its last summary says when that was, and each rank's entry when
that rank last reported.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

from hpc_train.core.files import read_json, write_json_atomic
from hpc_train.core.records import NodeSummary, Progress, RankCompute, RankStatus, StartupProfile, StragglerReport

__all__ = ["NODE_DIR_VARIABLE", "NODE_EVERY_S", "SOON_S", "NodeChannel", "node_base"]

log = logging.getLogger(__name__)

NODE_EVERY_S = 10.0
"""How often a node's summary is rewritten in steady training: one shared-file-system update per node."""
SOON_S = 1.0
"""A change of a rank's state (started, running) reaches the summary within about this long."""
LOCK_WAIT_S = 5.0
"""The longest a rank waits for the node's summary lock (a flush holds it for a few small reads)."""
NODE_DIR_VARIABLE = "HPC_TRAIN_NODE_DIR"
"""The node-local folder of this rank's node, for the processes the worker starts (a user's script)."""


def node_base() -> Path:
    """Where node-local folders go: ``/dev/shm`` (memory, on every Linux node), else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class NodeChannel:
    """What the ranks of one node write their statuses and progress to, and the node's summary is made from.

    ``folder`` is node-local; ``summary`` is the node's summary file in the run dir (``RunDir.node_summary``). ``local_ranks``: how many
    ranks the node runs (the folder is removed once all of them have ended).
    """

    def __init__(self, folder: Path, summary: Path, *, host: str, run: str, local_ranks: int = 1) -> None:
        self.folder, self.summary, self.host, self.run = folder, summary, host, run
        self.local_ranks = local_ranks
        self.every_s = NODE_EVERY_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._states: dict[int, str] = {}
        """The state this process last reported for each of its ranks (a change marks the folder)."""
        self._flushed_at = 0.0

    @classmethod
    def open(
        cls, run_dir: Path, summary: Callable[[str], Path], *, job: str, local_ranks: int, base: Path | None = None
    ) -> NodeChannel:
        """The channel of this node for ``run_dir`` in the attempt ``job`` names (its Slurm job and attempt),
        summarised to ``summary(host)`` (``RunDir.node_summary``, which owns the name): each node, run and attempt
        has a folder of its own, so an earlier attempt's ranks never mix in."""
        host = socket.gethostname()
        run = str(run_dir.resolve())
        key = hashlib.sha256(f"{run}\0{host}\0{job}".encode()).hexdigest()[:20]
        folder = (base or node_base()) / f"hpc_train-{os.getuid()}" / key
        folder.mkdir(parents=True, exist_ok=True)
        return cls(folder, summary(host), host=host, run=run, local_ranks=local_ranks)

    @classmethod
    def from_environ(
        cls, run_dir: Path, summary: Callable[[str], Path], environ: Mapping[str, str] | None = None
    ) -> NodeChannel | None:
        """The channel the worker that started this process opened (None when it opened none): a user's
        script's progress goes through it. ``summary`` as for ``open``."""
        folder = (os.environ if environ is None else environ).get(NODE_DIR_VARIABLE)
        if not folder or not Path(folder).is_dir():
            return None
        host = socket.gethostname()
        return cls(Path(folder), summary(host), host=host, run=str(run_dir.resolve()))

    # ---- what a rank writes -------------------------------------------------------------------------------------

    def report(self, status: RankStatus) -> bool:
        """A rank's status, node-local; one that ends the rank reaches the summary now. False when it should
        have and did not (the summary's lock was held past LOCK_WAIT_S: a rank stopped in the middle of a flush):
        the caller then writes it elsewhere."""
        write_json_atomic(self.folder / f"rank_{status.rank}.json", status.to_json(), durable=False)
        if self._states.get(status.rank) != status.state.value:
            self._states[status.rank] = status.state.value
            self._changed.touch()  # news for the reporter: the summary gets it within SOON_S
        return status.state.live or self.flush() is not None

    @property
    def _changed(self) -> Path:
        return self.folder / ".changed"

    def report_progress(self, rank: int, progress: Progress) -> None:
        write_json_atomic(self.folder / f"progress_{rank}.json", replace(progress, rank=rank).to_json(), durable=False)

    def report_startup(self, profile: StartupProfile) -> None:
        """Where a rank's start-up went: in the node's next summary (``jobs status`` shows the slowest rank)."""
        write_json_atomic(self.folder / f"startup_{profile.rank}.json", profile.to_json(), durable=False)

    def report_compute(self, record: RankCompute) -> None:
        """A rank's own compute time in its latest window (a user's script: stragglers), in the next summary."""
        write_json_atomic(self.folder / f"compute_{record.rank}.json", record.to_json(), durable=False)

    def status(self, rank: int) -> RankStatus | None:
        """The rank's latest status on this node."""
        return RankStatus.salvage(read_json(self.folder / f"rank_{rank}.json"))[0]

    def progress(self, rank: int) -> Progress | None:
        return Progress.salvage(read_json(self.folder / f"progress_{rank}.json"))[0]

    def publish_stragglers(self, report: StragglerReport) -> None:
        """Rank 0's latest straggler verdict (a user's script: its worker judges), node-local, where rank 0's script
        reads it for its own trackers (``script_clock.TrackerFigures``). Not part of the summary."""
        write_json_atomic(self.folder / "stragglers.json", report.to_json(), durable=False)

    def stragglers(self) -> StragglerReport | None:
        """The verdict ``publish_stragglers`` left on this node (None: none yet, or unreadable)."""
        return StragglerReport.salvage(read_json(self.folder / "stragglers.json"))[0]

    # ---- the summary --------------------------------------------------------------------------------------------

    def collect(self) -> NodeSummary:
        """The node's ranks as its folder holds them now."""
        ranks = [self.status(int(p.stem[5:])) for p in self.folder.glob("rank_*.json") if p.stem[5:].isdigit()]
        progress = [Progress.salvage(read_json(p))[0] for p in self.folder.glob("progress_*.json")]
        startup = [StartupProfile.salvage(read_json(p))[0] for p in self.folder.glob("startup_*.json")]
        compute = [RankCompute.salvage(read_json(p))[0] for p in self.folder.glob("compute_*.json")]
        return NodeSummary(
            host=self.host,
            time=time.time(),
            run=self.run,
            ranks=tuple(sorted((r for r in ranks if r is not None), key=lambda r: r.rank)),
            progress=tuple(sorted((p for p in progress if p is not None), key=lambda p: p.rank or 0)),
            startup=tuple(sorted((p for p in startup if p is not None), key=lambda p: p.rank)),
            compute=tuple(sorted((c for c in compute if c is not None), key=lambda c: c.rank)),
        )

    def flush(self) -> NodeSummary | None:
        """Write the node's summary to the run dir now (None when the lock could not be had in LOCK_WAIT_S:
        another rank is writing it, and the next flush carries this rank's news)."""
        with self._lock("flush", LOCK_WAIT_S) as held:
            if not held:
                return None
            self._changed.unlink(missing_ok=True)  # before collecting: a change made meanwhile marks it again
            summary = self.collect()
            if not summary.ranks:  # the folder was emptied (every rank ended): the last summary stands
                return None
            write_json_atomic(self.summary, summary.to_json(), durable=False)
            self._flushed_at = time.monotonic()
            if len(summary.ranks) >= self.local_ranks and not any(r.state.live for r in summary.ranks):
                self._remove()  # every rank of the node has ended, and said so in the summary
            return summary

    def due(self, now: float) -> bool:
        """A flush is due: the period is up, or a rank's state changed since the last flush (and SOON_S passed
        since this process's last one): one stat of the node's folder."""
        if now - self._flushed_at >= self.every_s:
            return True
        return now - self._flushed_at >= SOON_S and self._changed.exists()

    def tick(self, now: float) -> NodeSummary | None:
        """What the node's reporter does every SOON_S / 2: flush when one is due."""
        return self.flush() if self.due(now) else None

    # ---- the reporter -------------------------------------------------------------------------------------------

    def start(self) -> NodeChannel:
        """Take part in reporting: a daemon thread that becomes the node's reporter when it holds the node's
        reporter lock (one rank of the node at a time; when that rank ends, another takes the role over)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._report, name="hpc_train-node", daemon=True)
            self._thread.start()
        return self

    def _report(self) -> None:
        """The reporter's loop. A flush that fails (a full or gone run dir) is tried again at the next period, not
        at every tick, and said once; a node folder that fails ends this rank's part in reporting, with a word
        (its ranks' last words still reach the run dir: ``RunDir`` writes them there when the node fails)."""
        failing = False
        try:
            with self._lock("reporter", None, until=self._stop) as held:
                while held and not self._stop.wait(SOON_S / 2):
                    try:
                        flushed = self.tick(time.monotonic())
                    except OSError as exc:
                        self._flushed_at = time.monotonic()  # the next try at the next period
                        if not failing:
                            log.warning(
                                "hpc_train: node %s could not write its summary %s (%s); trying again every %g s",
                                self.host,
                                self.summary,
                                exc,
                                self.every_s,
                            )
                        failing = True
                    else:
                        failing = failing and flushed is None
        except OSError as exc:
            log.warning(
                "hpc_train: node %s's status folder %s failed (%s): this rank no longer reports the node's "
                "summary; its ranks still write their last words to the run dir",
                self.host,
                self.folder,
                exc,
            )

    def close(self) -> None:
        """Stop reporting (the rank's final status has already been flushed by ``report``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=LOCK_WAIT_S)
            self._thread = None

    @contextmanager
    def _lock(self, name: str, wait_s: float | None, until: threading.Event | None = None) -> Iterator[bool]:
        """Hold the node's ``name`` lock (flock: the kernel releases it when the holder dies). ``wait_s``: how
        long to try (None: until ``until`` is set). Yields whether it is held."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / f".{name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            deadline = None if wait_s is None else time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if (deadline is not None and time.monotonic() >= deadline) or (until and until.wait(SOON_S / 2)):
                        yield False
                        return
                    if until is None:
                        time.sleep(0.01)
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _remove(self) -> None:
        """Delete the node's folder: its ranks have all ended (a rank killed before it could say so leaves it to
        the node's epilog, or to the next boot: a few KB in memory)."""
        with suppress(OSError):
            for path in self.folder.iterdir():
                path.unlink(missing_ok=True)
            self.folder.rmdir()
