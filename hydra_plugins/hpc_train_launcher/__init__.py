"""Hydra launcher plugin of hpc_train (Hydra only loads launchers from the ``hydra_plugins`` namespace)."""
