"""``python -m hpc_train.script_boot SCRIPT|-m MODULE ARGS...``: kept as an alias of ``hpc_train.runtime.script_boot``."""

import sys

from hpc_train.runtime.script_boot import main

__all__ = ["main"]

if __name__ == "__main__":
    main(sys.argv[1:])
