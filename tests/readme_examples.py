"""The examples of README.md and of the manual (docs/*.md), so tests can run every one of them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .conftest import REPO

READMES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""Every page a user reads: the README and the manual's pages (mkdocs.yml builds the site from docs/)."""
# Shrink each example so the suite stays fast; the overrides keep the example's own choices.
SHRINK = ["trainer.max_steps=3", "data.num_samples=512", "trainer.batch_size=16", "trainer.log_every_n_steps=1"]


def code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def manual_blocks() -> list[tuple[str, str]]:
    """The code blocks of every page, in READMES' order."""
    return [block for page in READMES for block in code_blocks(page.read_text())]


def cli_examples(module: str = "hpc_train") -> list[list[str]]:
    """The arguments of every distinct `python -m <module> ...` line in a bash block (comments dropped)."""
    examples = []
    for lang, body in manual_blocks():
        if lang == "bash":
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if words[:3] == ["python", "-m", module] and words[3:] not in examples:
                    examples.append(words[3:])  # a command the README repeats is run once
    return examples


def shrunk_study(args: list[str]) -> list[str]:
    """A scaling example with its config overrides (after --) shrunk like any run."""
    split = args.index("--")
    return [*args[: split + 1], *shrunk(args[split + 1 :])]


def module_files() -> dict[str, str]:
    """Python blocks that open with `# <name>.py`: modules the examples import, to be written out first."""
    files = {}
    for lang, body in manual_blocks():
        first = body.splitlines()[0] if body else ""
        if lang == "python" and re.fullmatch(r"# \w+\.py", first):
            files[first[2:]] = body
    return files


def user_conf_files() -> dict[str, str]:
    """YAML blocks whose leading comments name a file `# conf/<group>/<name>.yaml`: the user repository's configs."""
    files = {}
    for lang, body in manual_blocks():
        header = [line for line in body.splitlines() if line.startswith("#")][:2]
        names = [m[1] for m in (re.match(r"# (conf/[\w/-]+\.yaml)\b", line) for line in header) if m]
        if lang == "yaml" and names:
            files[names[0]] = body
    return files


def user_repo_examples() -> list[list[str]]:
    """The arguments of every `hpc-train --config-dir conf ...` line: commands run inside the user's repository."""
    examples = []
    for lang, body in manual_blocks():
        if lang == "bash":
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if words[:3] == ["hpc-train", "--config-dir", "conf"]:
                    examples.append(words[1:])
    return examples


def prepare_cwd(path: Path) -> None:
    """What the examples expect in their folder: the README's modules and conf/ files, and the repo's tests/."""
    for name, body in {**module_files(), **user_conf_files()}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(body)
    (path / "tests").symlink_to(REPO / "tests")


def shrunk(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("trainer.max_steps=")] + SHRINK


def is_slurm(args: list[str]) -> bool:
    return "cluster=slurm" in args
