"""scripts/house_figures.py, the structure figures the house issues report, counts what it says it counts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO

SCRIPT = REPO / "scripts" / "house_figures.py"


def load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("house_figures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_attributes_counts_each_self_name_once(tmp_path: Path) -> None:
    source = tmp_path / "t.py"
    source.write_text(
        "class Trainer:\n"
        "    def __init__(self, other):\n"
        "        self.a = 1\n"
        "        self.a = 2\n"
        "        self.b, self.c = 3, 4\n"
        "        self.d: int = 5\n"
        "        other.e = 6\n"
        "        if True:\n"
        "            self.f = 7\n"
        "    def later(self):\n"
        "        self.g = 8\n"
    )
    assert load().init_attributes(source, "Trainer") == 5  # a, b, c, d, f
    assert load().init_attributes(source, "Missing") == 0


def test_figures_of_this_tree() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(REPO)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for start in ("worker entry:", "dict[str, Any] annotations:", "type: ignore:", "config modules:", "trainer:"):
        assert any(line.startswith(start) for line in out.splitlines()), (start, out)
    assert "Trainer.__init__ sets 0 attributes" not in out


def test_the_rooms_figures_count_lines_parameters_nesting_and_node_names(tmp_path: Path) -> None:
    module = tmp_path / "hpc_train" / "m.py"
    module.parent.mkdir()
    module.write_text(
        "class C:\n"
        "    def f(self, a, b=1, *rest, c, **more):\n"
        '        """node_x.json in a docstring does not count."""\n'
        "        for x in a:\n"
        "            if x:\n"
        "                pass\n"
        "            elif b:\n"
        "                with open(x):\n"
        "                    def inner():\n"
        "                        while True:\n"
        "                            pass\n"
        "        return f'node_{a}.json', 'node_lost', glob('node_*.json')\n"
    )
    figures = load()
    ((where, size, params, depth),) = [f for f in figures.functions(tmp_path) if f[0].endswith(":f")]
    assert (where, size, params, depth) == ("hpc_train/m.py:f", 11, 5, 3)  # for > if/elif > with; inner aside
    assert figures.node_names(tmp_path) == ["hpc_train/m.py:12"]  # the f-string and the glob, on one line
