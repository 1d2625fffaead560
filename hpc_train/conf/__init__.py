"""``hpc_train.conf`` in a checkout: the configs live in the repository's top-level ``conf/``.

This file loads ``conf/__init__.py`` as ``hpc_train.conf`` (the module it puts in ``sys.modules`` is the one
``import`` returns), so ``importlib.resources.files("hpc_train.conf")`` and Hydra's ``pkg://hpc_train.conf``
read ``conf/`` itself: one copy of each YAML file, live in an editable install (``pip install -e``) and with
the checkout on ``PYTHONPATH``. The wheel leaves this file out and ships ``conf/`` as ``hpc_train/conf``
(pyproject.toml, ``[tool.hatch.build.targets.wheel]``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_CONF = Path(__file__).resolve().parent.parent.parent / "conf"
_spec = importlib.util.spec_from_file_location(__name__, _CONF / "__init__.py", submodule_search_locations=[str(_CONF)])
if _spec is None or _spec.loader is None or not (_CONF / "config.yaml").is_file():
    raise ImportError(f"hpc_train's configs are not in {_CONF} (the top-level conf/ of the checkout)", name=__name__)
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
