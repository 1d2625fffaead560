"""The few named exceptions hpc_train raises at its module boundaries.

Policy: ``ConfigError`` for anything the user wrote (config, CLI), ``DistEnvironmentError`` for a launch
environment that cannot be turned into a consistent set of ranks, ``LaunchError`` for a job that could not be
started or ended badly. Assertions are kept for programmer invariants only.
"""

from __future__ import annotations


class HpcTrainError(Exception):
    """Base class of every error hpc_train raises on purpose."""


class ConfigError(HpcTrainError, ValueError):
    """A config value breaks a rule; the message names the key, the value and the fix (``HINT:``)."""


class DistEnvironmentError(HpcTrainError, RuntimeError):
    """The process environment (torchrun, Slurm, submitit) is missing a variable or is inconsistent."""


class LaunchError(HpcTrainError, RuntimeError):
    """A job could not be launched, or one of its ranks failed."""
