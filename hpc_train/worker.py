"""``python -m hpc_train.worker --run-dir RUN_DIR``: the path sbatch scripts and users type, kept as an alias.

The code is in ``hpc_train.runtime.worker``.
"""

from hpc_train.runtime.worker import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    main()
