"""Adds a user's config folders (``HPC_TRAIN_CONFIG_PATH``, ``~/.config/hpc_train``) to Hydra's search path;
the folders are chosen in ``hpc_train.core.searchpath``."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class HpcTrainSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from hpc_train.core.searchpath import user_config_dirs

        # Prepended in reverse so that the first listed folder comes first; all before hpc_train's own configs.
        for folder in reversed(user_config_dirs()):
            search_path.prepend(provider="hpc_train-user", path=f"file://{folder.resolve()}")
