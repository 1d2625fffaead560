"""``python -m hpc_train.jobs``: the path users type, kept as an alias of ``hpc_train.tools.jobs``."""

import sys

from hpc_train.tools.jobs import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
