"""``python -m hpc_train.supervisor --run-dir RUN_DIR`` (``--pack RUN_DIR...`` for a pack): the batch step of every
Slurm job, kept as an alias.

The code is in ``hpc_train.runtime.supervisor``.
"""

from hpc_train.runtime.supervisor import EXIT_FATAL, EXIT_GAVE_UP, main, run, supervise

__all__ = ["EXIT_FATAL", "EXIT_GAVE_UP", "main", "run", "supervise"]

if __name__ == "__main__":
    main()
