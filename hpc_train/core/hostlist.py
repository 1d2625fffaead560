"""Slurm hostlist expansion (``node[01-03,7],gpu-[1-2]`` -> one name per host).

We rely on python-hostlist (NSC's library, used by their Slurm tooling) instead of a hand-written regex: the
regexes in common launchers get nested or repeated bracket groups wrong (``node[1-2]-ib[3-4]``). The test-suite
checks its output against ``scontrol show hostnames`` wherever Slurm is installed.
"""

from __future__ import annotations

import hostlist as _hostlist

__all__ = ["compress_hostlist", "expand_hostlist", "parse_tasks_per_node"]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression in the order ``scontrol show hostnames`` prints it.

    Ranges keep their zero padding, several bracket groups expand left to right (the first varies slowest) and
    duplicates are kept, as Slurm keeps them. Raises ``ValueError`` naming ``expr`` when it is not a valid
    hostlist (an empty one, a descending range ``node[3-1]``, letters in a range ``node-[a-c]``...).
    """
    if not expr or expr != expr.strip() or any(c.isspace() for c in expr):
        raise ValueError(f"invalid Slurm hostlist {expr!r}: empty or contains white space")
    try:
        hosts: list[str] = _hostlist.expand_hostlist(expr, allow_duplicates=True, sort=False)
    except _hostlist.BadHostlist as exc:
        raise ValueError(f"invalid Slurm hostlist {expr!r}: {exc}") from None
    if not hosts or any(not h for h in hosts):
        raise ValueError(f"invalid Slurm hostlist {expr!r}: it names an empty host")
    return hosts


def compress_hostlist(hosts: list[str]) -> str:
    """The Slurm hostlist expression of ``hosts`` (``node[1-3,7]``), as ``scontrol show hostlist`` writes it:
    sorted, duplicates dropped. What a log says instead of a line per host."""
    if not hosts:
        return ""
    return str(_hostlist.collect_hostlist(hosts))


def parse_tasks_per_node(expr: str) -> list[int]:
    """Expand Slurm's compressed task counts, e.g. ``2(x3),1`` -> ``[2, 2, 2, 1]``.

    This is the format of ``SLURM_TASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE``: comma-separated counts,
    each optionally followed by ``(xN)`` for N consecutive nodes with that count.
    """
    counts: list[int] = []
    for item in expr.split(","):
        count, sep, repeat = item.partition("(x")
        if sep and not repeat.endswith(")"):
            raise ValueError(f"invalid task count list {expr!r}: {item!r} lacks the closing ')'")
        times = repeat[:-1] if sep else "1"
        if not (count.isdigit() and times.isdigit()) or int(times) == 0:
            raise ValueError(f"invalid task count list {expr!r}: cannot read {item!r} (expected N or N(xM))")
        counts.extend([int(count)] * int(times))
    return counts
