"""``from hpc_train.api import submit``: the path users type, kept as an alias of ``hpc_train.tools.api``."""

from hpc_train.tools.api import Run, compose_config, submit

__all__ = ["Run", "compose_config", "submit"]
