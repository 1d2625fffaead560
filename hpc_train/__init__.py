"""hpc_train: one command from a laptop debug run to N nodes x G GPUs on Slurm."""

__version__ = "0.1.0"
