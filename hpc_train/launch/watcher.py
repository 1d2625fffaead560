"""The watcher of a local launcher (``cluster=local``): it stops the ranks of a launcher that died.

submitit's controller is made to outlive the launcher, so a launcher killed with SIGKILL (or whose terminal
went away) would leave its ranks training on, unsupervised, in a run dir that no longer has an owner. A
watcher process (``watch``), started before the controller in a session of its own, holds the read end of a
pipe whose only write end is the launcher's: when the launcher ends, however it ends, the kernel closes it and
the watcher wakes. If the launcher is gone and ranks still run, it stops them the way Ctrl-C does (SIGTERM
until each has heard it; they checkpoint at the next step boundary), kills what is left after
``WATCH_STOP_S``, and only then gives the run dir's lease back: the lease names the watcher, so the run dir
stays owned until the ranks are gone.

The launcher's own Ctrl-C asks the ranks to stop the same way (``ask_ranks_to_stop``, ``task_pids``, from here).
The watcher is one process per local launch, so this module imports only ``hpc_train.core``: 0.08 CPU-s here,
against 0.3 with the launcher's modules (submitit, omegaconf, the config schema).
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

from hpc_train.core import owner
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import child_pids, pid_alive, process_start

__all__ = ["DONE", "POLL_S", "WATCH_STOP_S", "ask_ranks_to_stop", "task_pids", "watch"]

POLL_S = 0.2
RESEND_S = 1.0
DONE = b"done\n"
"""What the launcher tells its watcher before it closes the pipe: it ended by itself (a killed one cannot)."""
WATCH_STOP_S = 60.0
"""How long the watcher of a dead launcher lets the ranks take to checkpoint and stop before it kills them."""


def watch(argv: list[str]) -> int:
    """The watcher: ``READ_FD RUN_DIR LAUNCHER_PID LAUNCHER_START [LEASE_TOKEN]``. Reads the controller's pid
    from the launcher, then waits for the pipe to close. A launcher that is still alive closed it itself, with
    its job over; one that is gone died: its ranks are stopped (checkpointing first) and its lease is given back.
    Its output goes to ``submitit/controller.log``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    read_end, run_dir = int(argv[0]), RunDir(Path(argv[1]))
    launcher = (int(argv[2]), int(argv[3]) if argv[3].isdigit() else None)
    token = argv[4] if len(argv) > 4 else ""
    controller: tuple[int, int | None] | None = None
    done = False
    with os.fdopen(read_end, "rb") as pipe:
        for line in pipe:  # until end of file: the launcher closed it, or died
            if line.strip().isdigit():
                controller = (int(line), process_start(int(line)))
            done = done or line == DONE
    # Its last word, not its pid: a killed launcher's pipe closes while the process is still exiting, when /proc
    # may show it alive for a moment longer (seen on a loaded machine).
    launcher_alive = done and pid_alive(launcher[0]) and process_start(launcher[0]) == launcher[1]
    if controller is None and not launcher_alive:  # it died between starting the controller and naming it
        controller = _find_controller(run_dir.submitit)
    if controller is None or not _runs(controller):
        if not launcher_alive and token:
            owner.release_token(run_dir.path, token)
        return 0
    if launcher_alive:
        print(
            f"hpc_train watcher: the launcher ended with its job {controller[0]} still running: stopping it", flush=True
        )
    else:
        print(
            f"hpc_train watcher: the launcher (pid {launcher[0]}) is gone; asking the ranks of job {controller[0]} "
            f"to checkpoint and stop (killed after {WATCH_STOP_S:g}s)",
            flush=True,
        )
    stopped = _stop_orphaned(controller, run_dir)
    states = sorted({s.state.value for s in run_dir.rank_statuses().values()})
    print(
        f"hpc_train watcher: job {controller[0]} {'ended' if stopped else 'killed'}; rank states: {states}", flush=True
    )
    if not launcher_alive and token:
        owner.release_token(run_dir.path, token)
    return 0


def _find_controller(folder: Path) -> tuple[int, int | None] | None:
    """A submitit controller of ``folder`` that runs (``python -m submitit.local._local FOLDER``)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and b"submitit.local._local" in argv and str(folder).encode() in argv:
            return int(entry.name), process_start(int(entry.name))
    return None


def _runs(process: tuple[int, int | None]) -> bool:
    pid, start = process
    return pid_alive(pid) and (start is None or process_start(pid) == start)


def _stop_orphaned(controller: tuple[int, int | None], run_dir: RunDir, timeout_s: float = WATCH_STOP_S) -> bool:
    """Ask the ranks of the controller's job to checkpoint and stop, as Ctrl-C does; True when the job ended
    within ``timeout_s``, else its processes are killed."""
    deadline = time.monotonic() + timeout_s
    asked: dict[int, float] = {}
    while _runs(controller) and time.monotonic() < deadline:
        ask_ranks_to_stop(controller[0], run_dir, asked)
        time.sleep(POLL_S)
    if not _runs(controller):
        return True
    for pid in [*task_pids(str(controller[0]), run_dir.submitit), controller[0]]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return False


def task_pids(job_id: str, folder: Path) -> list[int]:
    """Every process of the job (ranks, and what they started), found by the variables submitit gives them:
    the status files miss a rank that has not written one yet."""
    key = f"SUBMITIT_LOCAL_JOB_ID={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if key in environ and any(v.startswith(b"SUBMITIT_") and str(folder).encode() in v for v in environ):
            pids.append(int(entry.name))
    return pids


def ask_ranks_to_stop(controller: int, run_dir: RunDir, asked: dict[int, float]) -> None:
    """SIGTERM to every rank, until it is sure to have been heard: a signal that lands before the rank's own
    handlers are in place (the interpreter still starting, or submitit's handler, which ignores SIGTERM) is
    lost. A rank writes its first status right after its handlers are in place (hpc_train.runtime.startup):
    a rank without one is asked again every RESEND_S, and once more when its status appears. ``asked``: pid ->
    time of the last ask, 0 once the rank is sure to have heard. Repeats do no harm: its handler keeps the
    first signal."""
    with_status = {s.pid for s in run_dir.rank_statuses().values()}
    now = time.monotonic()
    # The ranks are the children of submitit's controller (whose pid is the job id). Found this way, not through
    # the status files, a rank still importing torch (no status yet) is found too.
    for pid in child_pids(controller):
        last = asked.get(pid)
        if last == 0 or (last is not None and pid not in with_status and now - last < RESEND_S):
            continue
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        asked[pid] = 0 if pid in with_status else now
