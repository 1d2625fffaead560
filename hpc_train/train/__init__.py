"""The training side: Trainer (setup / fit / close), data, models, optimizer, checkpoints, metrics.

The trainer receives a validated Config, a DistEnv and a device; it knows nothing about Slurm or launchers.
"""
