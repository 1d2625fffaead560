"""Figures for the structure of the tree (issue 12): run ``python scripts/house_figures.py`` from the root.

- the worker entry's length in lines;
- the modules that know a run-directory file name: a string literal holding one (docstrings aside), or a
  folder name joined onto a path with ``/``;
- the rank-state string literals ("starting", "running", ...) and the files they are in;
- (issue 24) untyped records: ``dict[str, Any]`` annotations and ``.get("key")`` reads in the package, and its
  ``type: ignore`` comments; the config modules and their lengths; the attributes ``Trainer.__init__`` sets;
  the lengths of the trainer and the supervisor.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

FILE_NAMES = (
    "config.yaml",
    "metrics.jsonl",
    "model_final.pt",
    "model_best.pt",
    "rank_table.json",
    "job.json",
    "restarts.json",
    "batch_exit.json",
    "attempt.json",
    "launcher.log",
    "job.sbatch",
)
NUMBERED = re.compile(r"(^|/)(rank|step)_($|\*|\d|\{)")
"""rank_<r>.log, rank_<r>.json, step_<9 digits>.pt: a literal ending in "rank_" starts an f-string's name."""
FOLDER_NAMES = {"logs", "checkpoints", "status", "submitit", "profile", "tensorboard", "plots"}
STATES = {"starting", "running", "completed", "failed", "stopped"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # attribute docstrings
            ids.add(id(node.value))
    return ids


def scan(path: Path) -> tuple[bool, int]:
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    knows, states = False, 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if any(name in node.value for name in FILE_NAMES) or NUMBERED.search(node.value):
                knows = True
            if node.value in STATES:
                states += 1
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value in FOLDER_NAMES:
                knows = True
    return knows, states


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    files = sorted([*root.glob("hpc_train/**/*.py"), *root.glob("benchmarks/*.py")])
    found = {str(path.relative_to(root)): scan(path) for path in files}
    knowing = [name for name, (knows, _) in found.items() if knows]
    states = {name: count for name, (_, count) in found.items() if count}
    worker = next(p for p in (root / "hpc_train/runtime/worker.py", root / "hpc_train/worker.py") if p.exists())
    print(f"worker entry: {worker.relative_to(root)}, {len(worker.read_text().splitlines())} lines")
    print(f"modules that know a run-dir file name: {len(knowing)}: {', '.join(knowing)}")
    where = ", ".join(f"{name} ({count})" for name, count in states.items())
    print(f"rank-state string literals: {sum(states.values())} in {len(states)} files: {where}")
    records(root)


def init_attributes(path: Path, cls: str) -> int:
    """The distinct ``self.<name>`` that ``cls.__init__`` assigns in ``path``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                return 0
            names = {
                target.attr
                for sub in ast.walk(init)
                for target in (
                    sub.targets
                    if isinstance(sub, ast.Assign)
                    else [sub.target]
                    if isinstance(sub, ast.AnnAssign)
                    else []
                )
                for target in ([*target.elts] if isinstance(target, ast.Tuple) else [target])
                if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            }
            return len(names)
    return 0


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def records(root: Path) -> None:
    package = sorted(root.glob("hpc_train/**/*.py"))
    texts = {p: p.read_text() for p in package}
    untyped = sum(t.count("dict[str, Any]") for t in texts.values())
    gets = sum(len(re.findall(r'\.get\("', t)) for t in texts.values())
    ignores = {p.relative_to(root).as_posix(): t.count("type: ignore") for p, t in texts.items() if "type: ignore" in t}
    print(f'dict[str, Any] annotations: {untyped}; .get("key") reads: {gets}')
    top = ", ".join(f"{name} ({n})" for name, n in sorted(ignores.items(), key=lambda kv: -kv[1])[:4])
    print(f"type: ignore: {sum(ignores.values())} in {len(ignores)} files; most in {top}")
    config = [root / "hpc_train/config.py"] if (root / "hpc_train/config.py").exists() else []
    config += sorted((root / "hpc_train/config").glob("*.py"))
    sizes = ", ".join(f"{p.relative_to(root).as_posix()} {lines(p)}" for p in config)
    print(f"config modules: {len(config)}, {sum(lines(p) for p in config)} lines: {sizes}")
    trainer = root / "hpc_train/train/trainer.py"
    supervisor = root / "hpc_train/runtime/supervisor.py"
    print(
        f"trainer: {lines(trainer)} lines, Trainer.__init__ sets {init_attributes(trainer, 'Trainer')} attributes;"
        f" supervisor: {lines(supervisor)} lines"
    )
    parts = [root / f"hpc_train/runtime/{name}.py" for name in ("ledger", "retry", "srun")]
    split = ", ".join(f"{p.stem} {lines(p)}" for p in parts if p.exists())
    print(f"supervisor's parts: {split or 'none'}")
    readers = sorted(
        p.relative_to(root).as_posix()
        for p, t in texts.items()
        if re.search(r'environ(\.get\(|\[)\s*("SLURM_RESTART_COUNT"|"HPC_TRAIN_ATTEMPT"|ATTEMPT_VARIABLE)', t)
    )
    print(f"modules that read the restart count or attempt from the environment: {len(readers)} ({', '.join(readers)})")


if __name__ == "__main__":
    main()
