"""``python -m hpc_train [group=option ...] [key=value ...]``: compose and validate the config, launch it.

Everything lives in ``hpc_train.cli``; it is imported here, inside the guard, so that a Ctrl-C while Hydra and
the config are still being imported ends the command with one line instead of a traceback (held until the config
is composed, then served).
"""

from __future__ import annotations

import os
import sys

from hpc_train.core.errors import ExitCode
from hpc_train.core.signals import composed, hold_while_composing, sigterm_as_interrupt


def main() -> None:
    """Console-script entry point (``hpc-train``), the same as ``python -m hpc_train``."""

    # SIGTERM (kill, a CI runner's timeout) before a launcher has taken it over ends the command as Ctrl-C does,
    # with its one line, rather than killing it mid-way; the local launcher handles its own.
    try:
        with sigterm_as_interrupt():
            # Held from here until the config is composed (hpc_train.cli calls composed()): importing Hydra
            # builds its own schemas with OmegaConf, and a Ctrl-C that cuts that halfway surfaces as OmegaConf's
            # AttributeError (a traceback and exit 1; seen in CI with a Ctrl-C 0.5 s after launch).
            hold_while_composing()
            try:
                # under the hold: the CLI imports Hydra and the config (module docstring)
                from hpc_train.cli import main as cli_main

                cli_main()
            finally:
                composed()
    except KeyboardInterrupt:  # before a launcher took over its job's Ctrl-C or SIGTERM (importing, composing)
        print(f"\nhpc_train: {_interrupted()}", file=sys.stderr, flush=True)
        # A Ctrl-C that lands inside an import can leave CPython set to end the process by SIGINT at exit, though
        # it was handled here (exit status -2 instead of 130): end with 130 ourselves.
        # Nothing was started that needs cleaning up, and both streams are flushed.
        sys.stdout.flush()
        os._exit(ExitCode.INTERRUPTED)


def _interrupted() -> str:
    """What an interrupt that no launcher handled leaves behind: nothing, or Slurm jobs submitted just before."""
    slurm = sys.modules.get("hpc_train.launch.slurm")
    submitted = list(getattr(slurm, "SUBMITTED", ()))
    if not submitted:
        return "interrupted before the job started; nothing was launched"
    jobs = "; ".join(f"job {job_id} (run dir {run_dir})" for job_id, run_dir in submitted[:3])
    more = f" and {len(submitted) - 3} more" if len(submitted) > 3 else ""
    first = submitted[0][1]
    return (
        f"interrupted after Slurm accepted {jobs}{more}: submitted jobs go on. See them with "
        f"`python -m hpc_train.jobs status {first}`, stop them with `python -m hpc_train.jobs cancel {first}`"
    )


if __name__ == "__main__":
    main()
