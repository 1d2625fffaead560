"""The layer rule of docs/architecture.md: a module imports only from its own layer and the layers below.

Every import counts, including the lazy ones inside functions (they are how a layer would sneak back up).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each layer, and the layers it may import from (besides itself).
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "distributed": {"core"},
    # The experiment trackers' runs and rank 0's logging to them: config and run dir only (no torch).
    "tracking": {"core", "config"},
    # The second store a run's results are copied to (fsspec): config and run dir only (no torch).
    "mirror": {"core", "config"},
    "train": {"core", "config", "distributed", "mirror"},
    "runtime": {"core", "config", "distributed", "train", "tracking", "mirror"},
    # Callbacks for third-party trainers, imported by the user's script; nothing of ours imports them.
    "integrations": {"core", "config", "distributed", "train", "runtime", "tracking", "mirror"},
    # Launchers start ranks; the ranks build the trainer. So launch stays clear of train (and of torch).
    "launch": {"core", "config", "distributed", "runtime", "tracking", "mirror"},
    "tools": {"core", "config", "distributed", "train", "runtime", "launch", "tracking", "mirror"},
    "entry": {"core", "config", "distributed", "train", "runtime", "launch", "tools", "tracking", "mirror"},
    # Scripts a user runs (script.module=hpc_train.examples.x): user code, which may use any public part.
    "examples": {
        "core",
        "config",
        "distributed",
        "train",
        "runtime",
        "integrations",
        "launch",
        "tools",
        "entry",
        "tracking",
        "mirror",
    },
}


def layer_of(module: str) -> str:
    """The layer of a dotted module name inside hpc_train (or of one of our Hydra plugins)."""
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "entry"
    assert parts[0] == "hpc_train", module
    if len(parts) == 1:
        return "entry"  # the package itself
    if parts[1] in (
        "core",
        "distributed",
        "tracking",
        "mirror",
        "train",
        "runtime",
        "integrations",
        "launch",
        "tools",
        "examples",
    ):
        return parts[1]
    if parts[1] in ("config", "conf"):
        return "config"
    # __main__ and the thin aliases users type (hpc_train.worker, hpc_train.jobs, hpc_train.dist, ...)
    return "entry"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every hpc_train import in ``source``, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # `from hpc_train import worker` imports the module hpc_train.worker.
            found += [(node.lineno, f"{name}.{a.name}" if name == "hpc_train" else name) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "hpc_train"]


def violations(path: Path, source: str | None = None) -> list[str]:
    module = module_name(path)
    layer = layer_of(module)
    text = path.read_text() if source is None else source
    bad = []
    for line, target in imported(text, module, path.name == "__init__.py"):
        other = layer_of(target)
        if other != layer and other not in ALLOWED[layer]:
            bad.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {target} ({other})")
    return bad


def sources() -> list[Path]:
    return sorted([*ROOT.glob("hpc_train/**/*.py"), *ROOT.glob("hydra_plugins/**/*.py")])


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = [v for path in sources() for v in violations(path)]
    assert not bad, "imports that reach up a layer (see docs/architecture.md):\n" + "\n".join(bad)


def test_every_module_has_a_layer_the_rule_knows() -> None:
    assert {layer_of(module_name(p)) for p in sources()} <= set(ALLOWED)
    # The three kinds of module are in folders of their own.
    assert {"core", "runtime", "tools"} <= {layer_of(module_name(p)) for p in sources()}


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("hpc_train/core/rundir.py", "from hpc_train.config import Config\n"),
        ("hpc_train/distributed/env.py", "def f():\n    from hpc_train.launch.slurm import submit_slurm\n"),
        ("hpc_train/train/observe.py", "import hpc_train.tools.plot\n"),
        ("hpc_train/launch/sweep.py", "from hpc_train import __main__\n"),
        ("hpc_train/launch/local.py", "from hpc_train.train.trainer import Trainer\n"),
        ("hpc_train/runtime/worker.py", "from ..launch import launch\n"),
    ],
)
def test_the_rule_catches_an_import_reaching_up(where: str, source: str) -> None:
    assert violations(ROOT / where, source), f"{source!r} in {where} should break the rule"


def test_the_rule_lets_a_layer_import_downwards() -> None:
    assert not violations(ROOT / "hpc_train/runtime/worker.py", "from hpc_train.train.trainer import Trainer\n")
    assert not violations(ROOT / "hpc_train/tools/jobs.py", "from ..launch.state import job_state\n")


def test_every_function_level_import_says_why() -> None:
    """An import inside a function hides the structure from readers and tools: each keeps torch, Hydra or an
    optional extra out of a process that must stay light (the launcher, the supervisor, a rank before its first
    status), or breaks an import loop, and says so in a comment on its line or above its block."""
    unexplained = []
    for path in sorted(ROOT.glob("hpc_train/**/*.py")):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        module_level = {
            id(node)
            for statement in tree.body
            if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            for node in ast.walk(statement)
        }
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in module_level]
        block = {line for node in found for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
        for node in found:
            if "#" in lines[node.lineno - 1]:
                continue
            above = node.lineno - 2  # the line above, past the rest of its block of imports and blank lines
            while above >= 0 and (above + 1 in block or not lines[above].strip()):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, "function-level imports without a reason:\n" + "\n".join(unexplained)


def test_the_architecture_notes_import_table_is_the_rule_enforced() -> None:
    """docs/architecture.md's table of what each layer may import says what ALLOWED enforces."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in text.split("## The import rule", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in ALLOWED:
            listed = cells[1].split("(", 1)[0]  # a note in parentheses is not a layer
            rows[cells[0]] = {word.strip() for word in listed.split(",") if word.strip() in ALLOWED}
    assert rows == ALLOWED
