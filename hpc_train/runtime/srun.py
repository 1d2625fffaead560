"""srun I/O for the supervisor: the command line of one training step, and the step as it runs.

The step's stderr is copied through byte for byte, and srun's own lines are kept for ``SrunReport``. A stop
signal gets srun a grace period; a step none of whose ranks starts is ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from hpc_train.config import ClusterConfig
from hpc_train.core.rundir import RunDir
from hpc_train.runtime.commands import WORKER, srun_argv
from hpc_train.train.stopping import StopSignals

__all__ = ["SrunStep", "say", "step_argv"]

SRUN_LINES = 500
LINE_LIMIT = 4096


def say(message: str, stream: IO[str] | None = None) -> None:
    """A line of the supervisor's own, on its stderr (or ``stream``)."""
    print(f"hpc_train supervisor: {message}", file=stream or sys.stderr, flush=True)


def step_argv(
    rd: RunDir, cluster: ClusterConfig, nodes: list[str], python: str, share: Sequence[str] = ()
) -> list[str]:
    """The srun command of one training step on ``nodes``; ``share``: a pack member's options for its part of
    the allocation (``runtime.pack``). cluster.slurm.srun_args come last, so they win."""
    srun, *options = srun_argv(cluster)
    return [
        srun,
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes) * cluster.tasks_per_node}",
        f"--ntasks-per-node={cluster.tasks_per_node}",
        f"--cpus-per-task={cluster.cpus_per_task}",
        f"--nodelist={','.join(nodes)}",
        *share,
        *options,
        *cluster.container_argv,
        python,
        "-u",
        "-m",
        WORKER,
        "--run-dir",
        str(rd.path),
    ]


class SrunStep:
    """One srun. Its stderr is copied through byte for byte (a progress bar's carriage returns included) and
    srun's own lines (``srun: ...``) are kept, the latest ``SRUN_LINES``, for ``SrunReport``."""

    def __init__(self, argv: list[str], env: Mapping[str, str], forward_stop: int = 0, hasty: bool = False) -> None:
        self.lines: deque[str] = deque(maxlen=SRUN_LINES)
        self.launch_timed_out = False
        """No rank started within the launch time: ``wait`` ended srun."""
        self.forward_stop = forward_stop
        """The signal to pass to srun when this process gets a stop (0: none). Not SIGTERM or SIGINT: srun
        answers those by ending the step, with SIGKILL after KillWait; it forwards USR1/USR2 to the tasks."""
        self.hasty = hasty
        """A second stop signal ends the step at once (a second Ctrl-C at a terminal). Not in a pack, where a
        member may hear the stop both from Slurm and from the pack's supervisor."""
        # Forwarding (an interactive allocation): srun gets its own process group, so that a terminal's Ctrl-C
        # reaches only the supervisor, which passes a stop on; srun's own first Ctrl-C only prints status.
        self.proc = subprocess.Popen(argv, env=dict(env), stderr=subprocess.PIPE, start_new_session=bool(forward_stop))
        self._reader = threading.Thread(target=self._copy, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _copy(self, stream: IO[bytes]) -> None:
        out = getattr(sys.stderr, "buffer", None)
        partial = b""
        while chunk := os.read(stream.fileno(), 65536):
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode(errors="replace"))
                sys.stderr.flush()
            *complete, partial = (partial + chunk).split(b"\n")
            partial = partial[-LINE_LIMIT:]  # a progress bar redraws without a newline for as long as it runs
            self.lines.extend(line.decode(errors="replace") for line in complete if line.startswith(b"srun:"))
        if partial.startswith(b"srun:"):
            self.lines.append(partial.decode(errors="replace"))

    def wait(
        self,
        signals: StopSignals,
        grace_s: float,
        started: Callable[[], bool],
        launch_s: float,
        cancelled: Callable[[], bool] = lambda: False,
        tick: Callable[[], None] = lambda: None,
    ) -> int:
        """srun's exit status. After a stop signal srun gets ``grace_s`` before it is ended; when no rank has
        ``started()`` within ``launch_s`` (the step never launched), it is ended too. ``cancelled()`` (``jobs
        cancel`` of a pack's member) counts as a stop signal: the step is passed ``forward_stop``. ``tick()`` is
        called about once a second while the step runs (the supervisor's growth check)."""
        began = time.monotonic()
        signalled_at: float | None = None
        launched = False
        while True:
            try:
                code = self.proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.hasty and signals.count > 1:  # a second Ctrl-C: no checkpoint wanted, end it now
                say("a second stop signal; ending srun")
                code = self.end()
                break
            if signalled_at is None and (signals.received or cancelled()):
                signalled_at = time.monotonic()
                if not signals.received:
                    say("cancelled by `python -m hpc_train.jobs cancel`; stopping the step (its ranks checkpoint)")
                if self.forward_stop:  # srun passes it on to every task: they checkpoint and stop
                    self.proc.send_signal(self.forward_stop)
            if signalled_at is not None and time.monotonic() - signalled_at > grace_s:
                say(f"srun still runs {grace_s:.0f}s after signal {signals.received}; ending it")
                code = self.end()
                break
            if signalled_at is None:
                tick()
            launched = launched or started()
            if not launched and signalled_at is None and time.monotonic() - began > launch_s:
                say(f"no rank of the step started within {launch_s:.0f}s; ending srun")
                self.launch_timed_out = True
                code = self.end()
                break
        self._reader.join(timeout=10)
        return code

    def end(self) -> int:
        """End srun: SIGTERM (srun passes it on to the tasks), then SIGKILL; its exit status."""
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=15)
