"""hpc_train's own Hydra configs (YAML), shipped inside the package: found as ``pkg://hpc_train.conf``."""
