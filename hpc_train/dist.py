"""``hpc_train.dist``: kept as an alias of ``hpc_train.distributed``, the rank-resolution package's old name.

``import hpc_train.dist``, ``from hpc_train.dist import X`` and ``from hpc_train.dist.env import Y`` give the very
same module objects as ``hpc_train.distributed`` and ``hpc_train.distributed.env``: this module puts the package in
``sys.modules`` under its own name, and a finder on ``sys.meta_path`` answers ``hpc_train.dist.<sub>`` with the
module ``hpc_train.distributed.<sub>``, imported on demand, so the alias does not import torch before the package
does. It is a module file, not a folder: tools (ruff among them) skip every folder named ``dist``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

import hpc_train.distributed

_OLD = __name__
_NEW = hpc_train.distributed.__name__


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``hpc_train.dist.<sub>`` as the module ``hpc_train.distributed.<sub>`` itself, not a copy."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        real = importlib.util.find_spec(_NEW + fullname[len(_OLD) :])
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=real.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_NEW + spec.name[len(_OLD) :])
        # The import system stamps the alias's spec on the module it is given; exec_module puts the real one back.
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias = module.__spec__.name if module.__spec__ is not None else ""
        if alias in self._specs:
            module.__spec__ = self._specs.pop(alias)


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

sys.modules[_OLD] = hpc_train.distributed
