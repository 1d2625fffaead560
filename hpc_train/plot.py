"""``python -m hpc_train.plot``: the path users type, kept as an alias of ``hpc_train.tools.plot``."""

import sys

from hpc_train.tools.plot import main, plot_compare, plot_run, pyplot, save

__all__ = ["main", "plot_compare", "plot_run", "pyplot", "save"]

if __name__ == "__main__":
    sys.exit(main())
