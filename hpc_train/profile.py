"""``python -m hpc_train.profile``: the path users type, kept as an alias of ``hpc_train.tools.profile``."""

import sys

from hpc_train.tools.profile import main, profile_yaml, table

__all__ = ["main", "profile_yaml", "table"]

if __name__ == "__main__":
    sys.exit(main())
