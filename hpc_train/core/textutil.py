"""Plain-text tables for the terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

__all__ = [
    "PROGRESS_TTY",
    "at_step",
    "first_few",
    "format_table",
    "number_ranges",
    "plural",
    "shows_progress_bar",
]

PROGRESS_TTY = "HPC_TRAIN_PROGRESS_TTY"
"""Set to 1 by a local launcher whose own stderr is a terminal: it copies rank 0's stderr there, bar included."""


def shows_progress_bar() -> bool:
    """Whether this process's stderr ends up on a terminal, where a progress bar's redraws make sense."""
    return sys.stderr.isatty() or os.environ.get(PROGRESS_TTY) == "1"


def plural(count: int, word: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def asked_for(low: int, high: int, got: int) -> str:
    """``asked for 2-8 nodes, got 4``: what a job that asks Slurm for a node range (``cluster.min_nodes``) was given."""
    return f"asked for {low}-{high} nodes, got {got}"


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, the header first."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells)


def number_ranges(numbers: Iterable[int]) -> str:
    """``0-3,8,10,11``: sorted, each run of three or more consecutive numbers as one range."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in spans)


def first_few(items: Sequence[str], shown: int = 5, sep: str = ", ") -> str:
    """``a, b, c and 17 more``: a list that grows with the job named by its first few and counted (``sep``
    between them: "; " for items that hold commas themselves)."""
    head = sep.join(items[:shown])
    return head if len(items) <= shown else f"{head} and {len(items) - shown} more"


def at_step(step: int | None) -> str:
    """``at step 12``, or what to say when a user's script reported no step (hpc_train.preemption unused)."""
    return f"at step {step}" if step is not None else "(the script reported no step)"
