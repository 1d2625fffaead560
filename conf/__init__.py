"""hpc_train's own Hydra configs (YAML), found as ``pkg://hpc_train.conf``.

They live in ``conf/`` at the top of the repository; the wheel ships this folder as ``hpc_train/conf``
(pyproject.toml, ``[tool.hatch.build.targets.wheel]``). In a checkout, ``hpc_train/conf/__init__.py`` loads
this file as ``hpc_train.conf``, so importlib.resources and Hydra read this folder.
"""
