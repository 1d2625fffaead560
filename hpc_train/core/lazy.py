"""Packages whose heavy names load on first use (PEP 562), so that a process needing one light module of the
package does not pay for the rest: ``hpc_train.distributed`` (torch) and ``hpc_train.launch`` (the launcher's
config and trackers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from ``package.<modules[name]>``, imported when
    it is first asked for."""

    def __getattr__(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
