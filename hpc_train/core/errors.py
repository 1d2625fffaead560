"""The few named exceptions hpc_train raises at its module boundaries.

Policy: ``ConfigError`` for anything the user wrote (config, CLI), ``DistEnvironmentError`` for a launch
environment that cannot be turned into a consistent set of ranks, ``LaunchError`` for a job that could not be
started or ended badly. Assertions are kept for programmer invariants only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit status hpc_train's commands, launchers, supervisors and ranks end with; every producer and reader
    takes it from here."""

    OK = 0
    FAILED = 1
    """A run that did not complete, or a command that could not do what it was asked (a launch error)."""
    USAGE = 2
    """Bad input (config, command line, a run dir that is not one): nothing was started."""
    HUNG = 75
    """A rank the watchdog ended: no step for trainer.watchdog_s (EX_TEMPFAIL: worth retrying)."""
    FATAL = 86
    """A Slurm job's exit code after a fatal failure: not retried, not requeued (the class is in
    status/attempts.json and `jobs status`)."""
    GAVE_UP = 87
    """A Slurm job's exit code when its failures were retryable but the limits are spent
    (cluster.slurm.max_failures, max_stalled_failures) or no healthy node is left."""
    INTERRUPTED = 130
    """Ended on Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it); a stop that checkpointed is resumable."""


EXIT_FATAL = ExitCode.FATAL
"""(The name the exit code had before ``ExitCode``: kept for code that imports it.)"""
EXIT_GAVE_UP = ExitCode.GAVE_UP


_failed_at: tuple[BaseException, int] | None = None
"""The failure this process reports and the step it came at (``tag_step``): a process reports one failure."""


def tag_step(error: BaseException, step: int) -> None:
    """Note that ``error`` ended training at ``step`` ("the same step" tells a repeated failure), without
    changing the exception: its type, message and traceback stay the ones the user and the classifier see.
    (Built-in exceptions take no weak references, and an attribute set on a foreign exception is a patch.)"""
    global _failed_at
    _failed_at = (error, step)


def failed_step(error: BaseException) -> int | None:
    """The step ``tag_step`` noted for this very exception, or None."""
    if _failed_at is not None and _failed_at[0] is error:
        return _failed_at[1]
    return None


class HpcTrainError(Exception):
    """Base class of every error hpc_train raises on purpose."""


class ConfigError(HpcTrainError, ValueError):
    """A config value breaks a rule; the message names the key, the value and the fix (``HINT:``)."""


class DistEnvironmentError(HpcTrainError, RuntimeError):
    """The process environment (torchrun, Slurm, submitit) is missing a variable or is inconsistent."""


class LaunchError(HpcTrainError, RuntimeError):
    """A job could not be launched, or one of its ranks failed."""


class Diverged(HpcTrainError, RuntimeError):
    """Training produced non-finite values (loss, gradients or weights): fatal, retrying would diverge again."""


@contextmanager
def exit_plainly(where: str = "") -> Iterator[None]:
    """End a command on a user's mistake with one line on stderr, not a traceback: ConfigError exits 2,
    LaunchError 1. Nothing was submitted when either comes before submission; ``where`` says what failed."""
    try:
        yield
    except ConfigError as exc:
        print(f"hpc_train: config error{where}, nothing was submitted: {exc}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE) from None
    except LaunchError as exc:
        print(f"hpc_train: nothing was submitted{where}: {exc}", file=sys.stderr)
        raise SystemExit(ExitCode.FAILED) from None
