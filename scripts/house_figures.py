"""Figures for the structure of the tree (issue 12): run ``python scripts/house_figures.py`` from the root.

- the worker entry's length in lines;
- the modules that know a run-directory file name: a string literal holding one (docstrings aside), or a
  folder name joined onto a path with ``/``;
- the rank-state string literals ("starting", "running", ...) and the files they are in;
- (issue 24) untyped records: ``dict[str, Any]`` annotations and ``.get("key")`` reads in the package, and its
  ``type: ignore`` comments; the config modules and their lengths; the attributes ``Trainer.__init__`` sets;
  the lengths of the trainer and the supervisor.
- (issue 47) the dict readers of the rank statuses against the typed ones, the failure-kind and exit-code
  literals, the places that work out the attempt number, function-level imports, import loops between the
  package's modules (module-level imports), and the README's length.
- (issue 58) the package's longest functions, the ones with the most parameters and the deepest nesting of
  blocks, and the places that spell a node summary's file name (``node_``) or glob for those files.
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
    house(root)
    rooms(root)


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


FAILURE_KINDS = {"killed", "node_lost", "collective", "hang", "exception", "unknown"}
FAILURE_KINDS |= {"repeated_exception", "import", "config", "diverged"}
ATTEMPT_DERIVERS = {"next_attempt", "_ran_before", "ran_before", "next_number"}
"""The functions that give an attempt number, or whether one ran before (issue 47: one owner, ``JobIdentity``)."""


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, name: str, is_package: bool) -> tuple[set[str], set[str], int]:
    """The hpc_train modules imported at module level, those imported inside functions, and the count of
    function-level imports of hpc_train modules (a nested function's counted once per enclosing function)."""
    top: set[str] = set()
    base = name if is_package else name.rpartition(".")[0]

    def runs_at_import(stmt: ast.stmt) -> bool:  # not a definition, nor an `if TYPE_CHECKING:` block
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            return False
        return not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)

    for node in (n for stmt in tree.body if runs_at_import(stmt) for n in ast.walk(stmt)):
        if isinstance(node, ast.Import):
            top |= {a.name for a in node.names if a.name.startswith("hpc_train")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join([*base.split(".")[: len(base.split(".")) - node.level + 1], module]).strip(".")
            if module.startswith("hpc_train"):
                top.add(module)
                top |= {f"{module}.{a.name}" for a in node.names}
    module_level = {
        id(n)
        for stmt in tree.body
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for n in ast.walk(stmt)
    }
    inner: set[str] = set()
    count = 0
    for imp in ast.walk(tree):
        if id(imp) in module_level:
            continue
        if isinstance(imp, ast.ImportFrom) and (imp.module or "").startswith("hpc_train"):
            count += 1
            inner |= {imp.module or ""} | {f"{imp.module}.{a.name}" for a in imp.names}
        elif isinstance(imp, ast.Import) and any(a.name.startswith("hpc_train") for a in imp.names):
            count += 1
            inner |= {a.name for a in imp.names}
    return top, inner, count


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def house(root: Path) -> None:
    package = sorted(root.glob("hpc_train/**/*.py"))
    texts = {p: p.read_text() for p in package}
    dict_readers = sum(len(re.findall(r"\.read_statuses\(", t)) for t in texts.values())
    typed_readers = sum(len(re.findall(r"\.rank_statuses\(", t)) for t in texts.values())
    print(f"rank statuses read as dicts (read_statuses): {dict_readers}; typed (rank_statuses): {typed_readers}")
    kinds, exits = 0, {130: 0, 1: 0, 2: 0}
    for text in texts.values():
        tree = ast.parse(text)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in FAILURE_KINDS and id(node) not in skip:
                kinds += text is texts.get(root / "hpc_train/runtime/failures.py")
            if isinstance(node, ast.Constant) and node.value == 130 and type(node.value) is int:
                exits[130] += 1
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "SystemExit",
                "exit",
            ):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and arg.value in (1, 2) and type(arg.value) is int:
                    exits[arg.value] += 1
    print(
        f"failure-kind string literals in runtime/failures.py: {kinds}; the literal 130: {exits[130]}; SystemExit/sys.exit(1): {exits[1]}, "
        f"(2): {exits[2]}"
    )
    derivers = []
    for path, text in texts.items():
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, ast.FunctionDef) and fn.name in ATTEMPT_DERIVERS:
                delegates = path.name != "identity.py" and "JobIdentity." in ast.unparse(fn)
                if not delegates:
                    derivers.append(f"{path.relative_to(root).as_posix()}:{fn.name}")
    print(f"definitions that work out an attempt number themselves: {len(derivers)}: {', '.join(derivers)}")
    graph: dict[str, set[str]] = {}
    hidden: dict[str, set[str]] = {}
    inner: dict[str, int] = {}
    modules = {_module_name(root, p) for p in package}
    for path, text in texts.items():
        name = _module_name(root, path)
        top, late, count = _imports(ast.parse(text), name, path.name == "__init__.py")
        graph[name] = {m for m in top if m in modules and m != name}
        hidden[name] = graph[name] | {m for m in late if m in modules and m != name}
        if count:
            inner[name] = count
    most = ", ".join(f"{n} ({c})" for n, c in sorted(inner.items(), key=lambda kv: -kv[1])[:4])
    print(f"function-level imports of hpc_train modules: {sum(inner.values())} in {len(inner)} modules; most in {most}")

    # A package's __init__ re-exports its modules: only loops between plain modules are counted.
    def plain(g: dict[str, set[str]]) -> dict[str, set[str]]:
        return {n: {m for m in v if not (root / m.replace(".", "/") / "__init__.py").exists()} for n, v in g.items()}

    for what, g in (("module-level imports", graph), ("with function-level imports", hidden)):
        loops = [
            c for c in _cycles(plain(g)) if not any((root / m.replace(".", "/") / "__init__.py").exists() for m in c)
        ]
        shown = "; ".join(" <-> ".join(c) for c in loops) or "none"
        print(f"import loops between modules ({what}): {len(loops)}: {shown}")
    readme = root / "README.md"
    print(f"README: {lines(readme)} lines; docs pages: {len(list((root / 'docs').glob('**/*.md')))}")


BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)
"""The statements whose bodies nest (``elif`` counts as its ``if``'s level, not one deeper)."""
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def nesting(node: ast.AST, depth: int = 0) -> int:
    """The deepest nesting of blocks under ``node``, not counting nested functions and classes' own bodies."""
    deepest = depth
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (*FUNCTIONS, ast.ClassDef, ast.Lambda)):
            continue
        is_elif = isinstance(node, ast.If) and isinstance(child, ast.If) and node.orelse == [child]
        inner = depth + (isinstance(child, BLOCKS) and not is_elif)
        deepest = max(deepest, nesting(child, inner))
    return deepest


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller passes: positional, keyword-only and the * and ** catch-alls; not self or cls."""
    args = fn.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def functions(root: Path) -> list[tuple[str, int, int, int]]:
    """(where, lines, parameters, nesting) of every function and method in the package."""
    found = []
    for path in sorted(root.glob("hpc_train/**/*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, FUNCTIONS):
                where = f"{path.relative_to(root).as_posix()}:{fn.name}"
                size = (fn.end_lineno or fn.lineno) - fn.lineno + 1
                found.append((where, size, parameters(fn), nesting(fn)))
    return found


def node_names(root: Path) -> list[str]:
    """Where the package spells a node summary's file name or a glob for them (a string holding ``node_...json``,
    docstrings aside)."""
    found = []
    for path in sorted(root.glob("hpc_train/**/*.py")):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if re.search(r"(^|[/*\s])node_\S*\.json", node.value):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
            elif isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else "X" for v in node.values]
                if re.search(r"(^|[/*\s])node_\S*\.json", "".join(map(str, parts))):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return sorted(set(found), key=lambda where: (where.split(":")[0], int(where.split(":")[1])))


def rooms(root: Path) -> None:
    every = functions(root)
    for title, column in (("longest functions (lines)", 1), ("most parameters", 2), ("deepest nesting", 3)):
        top = sorted(every, key=lambda f: (-f[column], f[0]))[:3]
        print(f"{title}: " + ", ".join(f"{where} ({row[column]})" for row in top for where in [row[0]]))
    spelled = node_names(root)
    print(f"node summary names spelled or globbed: {len(spelled)}: {', '.join(spelled)}")


if __name__ == "__main__":
    main()
