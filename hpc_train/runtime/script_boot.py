"""Runs a user's script or module as ``__main__`` (like ``python script.py``), with one addition at exit.

DDP models live in reference cycles, so a script's DDP (and the ProcessGroupGloo it holds) is often freed only
by the garbage collection during interpreter shutdown. Gloo's worker threads are then torn down while the
interpreter is half gone, and the process can abort ("terminate called without an active exception"; measured
here in about 1 run in 10 on 4 ranks, under torchrun too; see pytorch PR #179291). An atexit hook runs while
the interpreter is still whole: it collects those cycles and destroys a process group the script left behind.

    python -m hpc_train.runtime.script_boot path/to/script.py ARGS...
    python -m hpc_train.runtime.script_boot -m package.module ARGS...
"""

from __future__ import annotations

import atexit
import gc
import os
import runpy
import sys
import traceback
from types import TracebackType

from hpc_train.core.errors import ExitCode


def release_distributed() -> None:
    """Collect DDP's cycles and destroy a process group the script left behind, while the interpreter is whole."""
    gc.collect()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def main(argv: list[str]) -> None:
    atexit.register(release_distributed)
    if os.environ.get("HPC_TRAIN_STRAGGLER_WINDOW_S"):  # the worker asked: time the script's DDP model
        # only when the worker asked for the clock
        from hpc_train.runtime.script_clock import install

        install()
    try:
        _run(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - printed as the interpreter would, from the script's frame
        # The traceback as `python script.py` prints it: from the script's own first frame, without this
        # module's and runpy's (all of them when the error is ours: a script that cannot be found).
        traceback.print_exception(type(exc), exc, from_the_script(exc.__traceback__))
        sys.exit(ExitCode.FAILED)  # as the interpreter ends on an uncaught exception


def from_the_script(tb: TracebackType | None) -> TracebackType | None:
    """The part of a traceback that is the script's: what follows the last of runpy's frames (the whole of it
    when there is none, or nothing follows: a script that could not be found)."""
    start, frame = tb, tb
    while frame is not None:
        if "runpy" in os.path.basename(frame.tb_frame.f_code.co_filename) and frame.tb_next is not None:
            start = frame.tb_next
        frame = frame.tb_next
    return start


def _run(argv: list[str]) -> None:
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    path = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # as `python path` would have it
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
