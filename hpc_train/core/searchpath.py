"""Where a user's own configs are found, beside hpc_train's: cluster profiles, models, data, experiments.

Each folder is laid out like hpc_train's own ``conf/`` (``cluster/<name>.yaml``, ``model/<name>.yaml``, ...)
and is searched before hpc_train's own, so ``hpc-train cluster=<profile>`` works from any folder:

1. ``--config-dir DIR`` on the command line (Hydra's own flag), for a repository's ``conf/``;
2. every folder in ``HPC_TRAIN_CONFIG_PATH`` (separated like PATH);
3. ``$XDG_CONFIG_HOME/hpc_train`` (default ``~/.config/hpc_train``), where ``python -m hpc_train.profile
   --write`` puts profiles, if it exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path

__all__ = ["ENV_VAR", "config_dir_arg", "option_file", "user_config_dirs", "user_profile_dir"]

ENV_VAR = "HPC_TRAIN_CONFIG_PATH"


def user_profile_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The per-user config folder: ``$XDG_CONFIG_HOME/hpc_train``, or ``~/.config/hpc_train``."""
    env = os.environ if environ is None else environ
    home = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(home) / "hpc_train"


def user_config_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The folders searched before hpc_train's own configs, first match first (see the module docstring)."""
    env = os.environ if environ is None else environ
    listed = [Path(p).expanduser() for p in env.get(ENV_VAR, "").split(os.pathsep) if p]
    own = user_profile_dir(env)
    return [*listed, *([own] if own.is_dir() and own not in listed else [])]


def config_dir_arg(argv: list[str]) -> list[Path]:
    """The folder of Hydra's ``--config-dir DIR`` (or ``-cd DIR``, ``--config-dir=DIR``) in ``argv``, if any."""
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            return [Path(argv[i + 1])]
        if arg.startswith("--config-dir="):
            return [Path(arg.split("=", 1)[1])]
    return []


def option_file(group: str, option: str, argv: list[str], environ: Mapping[str, str] | None = None) -> Path | None:
    """The YAML file Hydra would load for ``group=option``: the user's folders first, then hpc_train's own."""

    for base in [*config_dir_arg(argv), *user_config_dirs(environ)]:
        path = base / group / f"{option}.yaml"
        if path.is_file():
            return path
    own = files("hpc_train.conf") / group / f"{option}.yaml"
    return Path(str(own)) if own.is_file() else None
