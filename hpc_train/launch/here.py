"""``cluster=slurm cluster.slurm.submit=here``: train in the allocation this shell already holds (``salloc``, or inside
a batch script of your own), with no new job.

The launcher becomes the batch step: it runs the same supervisor a submitted job runs, in the foreground, so
the training step goes out with srun on the allocation's nodes and keeps every guarantee (rank resolution from
the step, in-allocation restart after a failure, checkpoints on a stop signal). An interactive allocation cannot
be requeued: a stop checkpoints and ends, and the same command resumes.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

from hpc_train.config import Config
from hpc_train.core.errors import ConfigError, ExitCode
from hpc_train.core.hostlist import expand_hostlist
from hpc_train.core.records import AttemptOutcome
from hpc_train.core.rundir import RunDir
from hpc_train.launch.state import resume_command

__all__ = ["allocation_nodes", "inside_allocation", "launch_here"]


def inside_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """This process runs in a Slurm allocation but not inside one of its steps (an ``salloc`` shell, a batch
    script): srun from here starts steps on the allocation's nodes."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID")) and not env.get("SLURM_STEP_ID")


def allocation_nodes(cfg: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """The allocation's nodes; ConfigError when this is no allocation or it is too small for the request."""
    env = os.environ if environ is None else environ
    if not inside_allocation(env):
        where = "inside a job step (srun)" if env.get("SLURM_STEP_ID") else "outside any Slurm allocation"
        raise ConfigError(
            f"cluster.slurm.submit=here trains in the allocation this shell holds, but this runs {where}. HINT: run it "
            "in the shell that `salloc -N2` opens (not under srun), or submit a job with cluster.slurm.submit=submitit."
        )
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", ""))
    cluster = cfg.cluster
    if cluster.asks_range and len(nodes) < cluster.fewest_nodes:
        raise ConfigError(
            f"cluster.min_nodes={cluster.min_nodes} needs at least {cluster.fewest_nodes} nodes, but allocation "
            f"{env['SLURM_JOB_ID']} holds {len(nodes)} ({','.join(nodes)}). HINT: set cluster.min_nodes={len(nodes)}, "
            "or salloc more nodes."
        )
    if not cluster.asks_range and len(nodes) < cluster.allocated_nodes:
        raise ConfigError(
            f"cluster.nodes={cluster.nodes} (+ cluster.slurm.spare_nodes={cluster.slurm.spare_nodes}) needs "
            f"{cluster.allocated_nodes} nodes, but allocation {env['SLURM_JOB_ID']} holds {len(nodes)} "
            f"({','.join(nodes)}). HINT: set cluster.nodes={len(nodes)} (or cluster.min_nodes={len(nodes)} to train "
            "on fewer), or salloc more nodes."
        )
    return nodes


def launch_here(cfg: Config, run_dir: RunDir) -> int:
    """Run the supervisor in this process on this allocation; its exit status is the command's."""
    # the supervisor only for cluster.slurm.submit=here
    from hpc_train.runtime.supervisor import step_argv, supervise

    nodes = allocation_nodes(cfg)
    job = os.environ["SLURM_JOB_ID"]
    training = nodes[: cfg.cluster.nodes]
    if cfg.cluster.slurm.dry_run:
        argv = step_argv(run_dir, cfg.cluster, training, cfg.cluster.slurm.python or sys.executable)
        print(f"hpc_train: dry run; nothing started. In allocation {job} the training step would be:\n")
        print(shlex.join(argv), flush=True)
        return 0
    print(
        f"hpc_train: training in allocation {job} on {','.join(training)} (cluster.slurm.submit=here: no new job; the "
        f"same supervisor as a batch job). Run dir: {run_dir.path}",
        flush=True,
    )
    code = supervise(run_dir, interactive=True)
    attempts = run_dir.attempt_records()
    outcome = attempts[-1].outcome.value if attempts else "unknown"
    if attempts and attempts[-1].outcome is AttemptOutcome.STOPPED:
        step = max((s.step or 0 for s in run_dir.rank_statuses().values()), default=0)
        print(f"hpc_train: stopped at step {step} on a signal.\n  resume: {resume_command(run_dir)}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    print(f"hpc_train: training in allocation {job}: {outcome}. Run dir: {run_dir.path}", flush=True)
    return code
