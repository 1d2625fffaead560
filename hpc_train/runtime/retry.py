"""One retry policy: how often a run may start again, and when starting again is pointless.

A run starts again in two ways. After the preemption or time-limit signal it checkpoints and the job is
requeued (``runtime.requeue``); after a failure worth retrying the supervisor starts a new training step in the
same allocation (``runtime.supervisor``). Both are held to one ``RetryBudget``:

- a **limit** on the retries (``cluster.slurm.max_restarts`` requeues per run; ``cluster.slurm.max_failures`` restarts per
  allocation);
- a **stall limit** on the attempts in a row that made no progress (``cluster.slurm.max_stalled_restarts``,
  ``cluster.slurm.max_stalled_failures``): one more and retrying stops, with the reason.

**Progress** means the same for both (``progressed``): the attempt kept a step beyond the one it resumed from.
For the built-in trainer that is a checkpoint newer than the one it resumed from (a stop always saves one; a
failure keeps only what was saved before it). A user's script tells its steps through ``hpc_train.preemption``
and keeps what it saves itself, so any step it reported beyond the one it resumed from counts. A script that
reports no steps makes progress that is not known: it counts as progress, and only the limit bounds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpc_train.config import ClusterConfig
from hpc_train.core.records import AttemptRecord, Progress, RequeueEntry

__all__ = ["RetryBudget", "Spent", "attempt_progressed", "pick_nodes", "progressed", "requeue_progressed"]


def progressed(resumed: int | None, kept: int | None) -> bool | None:
    """Whether an attempt that resumed from step ``resumed`` kept step ``kept``, a later one; None when either
    is not known (a user's script that reports no steps)."""
    if resumed is None or kept is None:
        return None
    return kept > resumed


def requeue_progressed(entry: RequeueEntry) -> bool | None:
    """A stopped attempt saved the step it stopped at."""
    return progressed(entry.resumed_step, entry.stopped_step)


def attempt_progressed(attempt: AttemptRecord) -> bool | None:
    """A failed attempt keeps its newest checkpoint (a user's script: the last step it reported). The built-in
    trainer records its first step as it makes it, so one that recorded none made none."""
    progress = attempt.progress or Progress()
    if progress.first_step is None:
        return None if attempt.script else False
    kept = progress.step if attempt.script and progress.checkpoint_step is None else progress.checkpoint_step
    return progressed(progress.first_step - 1, kept) is True


@dataclass(frozen=True)
class Spent:
    """Why the budget allows no more retries."""

    stalled: bool
    """False: the limit is reached; True: too many attempts in a row made no progress."""
    count: int
    """The retries made (the limit), or the attempts in a row without progress (the stall)."""


@dataclass(frozen=True, kw_only=True)
class RetryBudget:
    limit: int
    """Retries allowed (0: none)."""
    stall_limit: int
    """Attempts in a row without progress that are tolerated; one more spends the budget."""

    @classmethod
    def requeues(cls, cluster: ClusterConfig) -> RetryBudget:
        return cls(limit=cluster.slurm.max_restarts, stall_limit=cluster.slurm.max_stalled_restarts)

    @classmethod
    def restarts(cls, cluster: ClusterConfig) -> RetryBudget:
        return cls(limit=cluster.slurm.max_failures, stall_limit=cluster.slurm.max_stalled_failures)

    def spent(self, retries: int, progress: Sequence[bool | None]) -> Spent | None:
        """Whether one more retry is refused, after ``retries`` retries and attempts that made ``progress``
        (oldest first, up to the one that just ended; None: not known, which counts as progress)."""
        if retries >= self.limit:
            return Spent(stalled=False, count=retries)
        stalled = 0
        for made in reversed(progress):
            if made is not False:
                break
            stalled += 1
        if stalled > self.stall_limit:
            return Spent(stalled=True, count=stalled)
        return None


def pick_nodes(
    allocation: list[str], bad: list[str], cluster: ClusterConfig, fits: Callable[[int], bool] = lambda n: True
) -> list[str] | str:
    """The nodes of the next attempt, or why there are not enough.

    Without spares or ``cluster.min_nodes`` every node of the allocation is used again. Otherwise blamed nodes
    are left out: ``cluster.nodes`` healthy ones when there are, else as many as are healthy, down to
    ``cluster.fewest_nodes``, and only a number of nodes that ``fits`` (the global batch splits over them).
    """
    if not cluster.slurm.spare_nodes and cluster.fewest_nodes == cluster.nodes:
        return allocation[: cluster.nodes]
    healthy = [n for n in allocation if n not in bad]
    usable = [n for n in range(min(len(healthy), cluster.nodes), cluster.fewest_nodes - 1, -1) if fits(n)]
    if not usable:
        fewest = f" (cluster.min_nodes={cluster.min_nodes})" if cluster.fewest_nodes < cluster.nodes else ""
        return (
            f"no healthy node left: training needs {cluster.fewest_nodes} nodes{fewest}; of the allocation "
            f"{','.join(allocation)}, {','.join(n for n in allocation if n in bad)} failed before. HINT: ask for "
            "more spares (cluster.slurm.spare_nodes) or allow fewer nodes (cluster.min_nodes), or resubmit: the "
            "run dir resumes from its last checkpoint and cluster.slurm.exclude can keep those nodes out"
        )
    return healthy[: usable[0]]
