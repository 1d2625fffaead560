"""``python -m hpc_train.scaling``: the path users type, kept as an alias of ``hpc_train.tools.scaling``."""

import sys

from hpc_train.tools.scaling import Point, main, plan, recommend, summarize

__all__ = ["Point", "main", "plan", "recommend", "summarize"]

if __name__ == "__main__":
    sys.exit(main())
