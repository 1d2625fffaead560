"""Turn the launch environment into one frozen ``DistEnv``.

One small resolver per source, tried in a fixed, logged precedence:

1. ``torchrun``: ``TORCHELASTIC_RUN_ID`` set, or both ``RANK`` and ``WORLD_SIZE``. Checked first because
   ``srun torchrun ...`` leaves the Slurm step variables in place but each torchrun worker is a different rank
   than the srun task that started torchrun.
2. ``slurm``: inside a job step (``SLURM_STEP_ID`` set), i.e. started by ``srun``.
3. ``submitit-local``: a task of submitit's ``LocalExecutor`` (``SUBMITIT_LOCAL_GLOBALID`` set).
4. ``single``: one process. Refused inside a Slurm allocation whose ``SLURM_NTASKS`` > 1 but outside a step,
   where the other ranks would never start and the first collective would hang.

A required variable that is missing or malformed raises ``DistEnvironmentError`` naming it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from hpc_train.core.errors import DistEnvironmentError
from hpc_train.core.hostlist import expand_hostlist, parse_tasks_per_node

__all__ = ["DistEnv", "Source", "derive_port", "detect_source", "resolve_environment"]

log = logging.getLogger(__name__)

Source = Literal["torchrun", "slurm", "submitit-local", "single"]
_T = TypeVar("_T")

# Ports are derived, not probed, so that every rank computes the same one without talking to the others.
# The range sits above the privileged ports and below Linux's default ephemeral range (32768-60999), so an
# outgoing connection never already holds it. Its width is prime: two job ids collide only when they differ by
# a multiple of it, never for differences like 10000 or 20000 that a "last four digits" formula maps together.
PORT_BASE = 20000
PORT_SPAN = 12763


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job: resolved once, then passed down unchanged."""

    rank: int
    """Global rank, 0 .. world_size-1."""
    local_rank: int
    """Rank among the processes on this node."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node (nodes may differ: Slurm's ``2(x3),1``)."""
    node_rank: int
    """Index of this node among the job's nodes."""
    num_nodes: int
    """Number of nodes taking part."""
    master_addr: str
    """Host of rank 0's rendezvous store."""
    master_port: int
    """Port of rank 0's rendezvous store."""
    source: Source
    """Which launcher the values came from."""
    hostname: str = ""
    """This host's name, for tables and error messages."""
    job_id: str = ""
    """The scheduler's job id when there is one (``123_4`` for an array element)."""

    def __post_init__(self) -> None:
        checks = [
            (self.world_size >= 1, "world_size >= 1"),
            (0 <= self.rank < self.world_size, "0 <= rank < world_size"),
            (1 <= self.local_world_size <= self.world_size, "1 <= local_world_size <= world_size"),
            (0 <= self.local_rank < self.local_world_size, "0 <= local_rank < local_world_size"),
            (1 <= self.num_nodes <= self.world_size, "1 <= num_nodes <= world_size"),
            (0 <= self.node_rank < self.num_nodes, "0 <= node_rank < num_nodes"),
            (0 < self.master_port < 65536, "0 < master_port < 65536"),
        ]
        broken = [rule for ok, rule in checks if not ok]
        if broken:
            raise DistEnvironmentError(
                f"inconsistent {self.source} environment: {self} breaks {', '.join(broken)}. "
                "HINT: the launcher's variables disagree with each other; compare them with `env | sort`."
            )

    @property
    def is_main(self) -> bool:
        """True on global rank 0, which logs and writes files for the job."""
        return self.rank == 0


def derive_port(*keys: int) -> int:
    """A port every rank of one job computes alike, from integer keys such as (job id, step id)."""
    key = 0
    for k in keys:
        key = key * 1_000_003 + k
    return PORT_BASE + key % PORT_SPAN


class _Vars:
    """Reads one source's variables; a missing or malformed required one fails with its name."""

    def __init__(self, environ: Mapping[str, str], source: str, why: str) -> None:
        self.environ, self.source, self.why = environ, source, why

    def get(self, *names: str) -> str | None:
        """The value of the first of ``names`` that is set and non-empty."""
        for name in names:
            value = self.environ.get(name, "").strip()
            if value:
                return value
        return None

    def req(self, *names: str) -> str:
        value = self.get(*names)
        if value is None:
            raise DistEnvironmentError(
                f"{' or '.join(names)} is not set, but the {self.source} launch was detected ({self.why}). "
                f"HINT: start the job through the launcher itself (srun / torchrun), or unset the variables "
                f"that made it look like a {self.source} launch."
            )
        return value

    def num(self, *names: str, default: int | None = None) -> int:
        raw = self.get(*names) if default is not None else self.req(*names)
        if raw is None:
            assert default is not None
            return default
        try:
            return int(raw)
        except ValueError:
            raise DistEnvironmentError(
                f"{'/'.join(names)}={raw!r} is not an integer ({self.source} launch, {self.why})."
            ) from None

    def master(self, default_addr: str, *port_keys: int) -> tuple[str, int]:
        """MASTER_ADDR/MASTER_PORT when the environment sets them, else the given address and a derived port."""
        addr = self.get("MASTER_ADDR") or default_addr
        port = self.num("MASTER_PORT", default=derive_port(*port_keys))
        return addr, port


def _job_key(raw: str, name: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise DistEnvironmentError(f"{name}={raw!r} is not an integer job id.") from None


def _from_torchrun(v: _Vars, hostname: str) -> DistEnv:
    world_size = v.num("WORLD_SIZE")
    local_world_size = v.num("LOCAL_WORLD_SIZE")
    rank = v.num("RANK")
    if world_size % local_world_size:
        raise DistEnvironmentError(
            f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}; torchrun starts "
            "the same number of workers on every node. HINT: check --nnodes and --nproc-per-node."
        )
    if world_size > 1 and v.get("MASTER_ADDR") is None:
        v.req("MASTER_ADDR")  # torchrun always sets it; a hand-made environment must too
    addr, port = v.master("127.0.0.1", os.getpid())
    return DistEnv(
        rank=rank,
        local_rank=v.num("LOCAL_RANK"),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=v.num("GROUP_RANK", default=rank // local_world_size),
        num_nodes=world_size // local_world_size,
        master_addr=addr,
        master_port=port,
        source="torchrun",
        hostname=hostname,
        job_id=v.get("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID") or "",
    )


def _from_slurm(v: _Vars, hostname: str) -> DistEnv:
    nodelist_var = "SLURM_STEP_NODELIST" if v.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    tasks_var = "SLURM_STEP_TASKS_PER_NODE" if v.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    nodes = _parsed(expand_hostlist, v.req(nodelist_var), nodelist_var)
    counts = _parsed(parse_tasks_per_node, v.req(tasks_var), tasks_var)
    world_size = v.num("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if len(counts) != len(nodes) or sum(counts) != world_size:
        raise DistEnvironmentError(
            f"{tasks_var}={v.get(tasks_var)!r} describes {len(counts)} nodes and {sum(counts)} tasks, but "
            f"{nodelist_var}={v.get(nodelist_var)!r} has {len(nodes)} nodes and the step has {world_size} tasks."
        )
    # SLURM_NODEID counts nodes of the whole job; a step may run on a subset, so prefer this node's position
    # in the step's own node list.
    node_name = v.get("SLURMD_NODENAME")
    node_rank = nodes.index(node_name) if node_name in nodes else v.num("SLURM_NODEID")
    job_id = v.req("SLURM_JOB_ID")
    step_id = v.num("SLURM_STEP_ID")
    addr, port = v.master(nodes[0], _job_key(job_id, "SLURM_JOB_ID"), step_id)
    array_job, array_task = v.get("SLURM_ARRAY_JOB_ID"), v.get("SLURM_ARRAY_TASK_ID")
    return DistEnv(
        rank=v.num("SLURM_PROCID"),
        local_rank=v.num("SLURM_LOCALID"),
        world_size=world_size,
        local_world_size=counts[node_rank] if node_rank < len(counts) else 0,
        node_rank=node_rank,
        num_nodes=len(nodes),
        master_addr=addr,
        master_port=port,
        source="slurm",
        hostname=node_name or hostname,
        job_id=f"{array_job}_{array_task}" if array_job and array_task else job_id,
    )


def _from_submitit_local(v: _Vars, hostname: str) -> DistEnv:
    world_size = v.num("SUBMITIT_LOCAL_NTASKS")
    job_id = v.req("SUBMITIT_LOCAL_JOB_ID")
    addr, port = v.master("127.0.0.1", _job_key(job_id, "SUBMITIT_LOCAL_JOB_ID"))
    return DistEnv(
        rank=v.num("SUBMITIT_LOCAL_GLOBALID"),
        local_rank=v.num("SUBMITIT_LOCAL_LOCALID"),
        world_size=world_size,
        local_world_size=world_size,  # the local executor runs one node
        node_rank=v.num("SUBMITIT_LOCAL_NODEID", default=0),
        num_nodes=v.num("SUBMITIT_LOCAL_JOB_NUM_NODES", default=1),
        master_addr=addr,
        master_port=port,
        source="submitit-local",
        hostname=hostname,
        job_id=job_id,
    )


def _single(v: _Vars, hostname: str) -> DistEnv:
    ntasks = v.num("SLURM_NTASKS", default=1)
    if v.get("SLURM_JOB_ID") and ntasks > 1:
        raise DistEnvironmentError(
            f"this process runs inside Slurm job {v.get('SLURM_JOB_ID')} with SLURM_NTASKS={ntasks} but outside "
            "a job step (SLURM_STEP_ID is not set), so it would be the only one of "
            f"{ntasks} ranks and wait forever for the others. HINT: launch every task with srun, e.g. "
            "`srun python -m hpc_train.worker --run-dir RUN_DIR`, or use `python -m hpc_train cluster=slurm`."
        )
    addr, port = v.master("127.0.0.1", os.getpid())
    return DistEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=addr,
        master_port=port,
        source="single",
        hostname=hostname,
        job_id=v.get("SLURM_JOB_ID") or "",
    )


def _parsed(parse: Callable[[str], list[_T]], raw: str, name: str) -> list[_T]:
    try:
        return parse(raw)
    except ValueError as exc:
        raise DistEnvironmentError(f"{name}: {exc}") from None


def detect_source(environ: Mapping[str, str]) -> tuple[Source, str]:
    """Which source ``resolve_environment`` will use, and the variables that decide it (for logs)."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        return "torchrun", "TORCHELASTIC_RUN_ID is set"
    if environ.get("RANK") and environ.get("WORLD_SIZE"):
        return "torchrun", "RANK and WORLD_SIZE are set"
    if environ.get("SLURM_STEP_ID"):
        return "slurm", "SLURM_STEP_ID is set (inside an srun step)"
    if environ.get("SUBMITIT_LOCAL_GLOBALID"):
        return "submitit-local", "SUBMITIT_LOCAL_GLOBALID is set"
    return "single", "no torchrun, Slurm step or submitit-local variables"


_RESOLVERS: dict[Source, Callable[[_Vars, str], DistEnv]] = {
    "torchrun": _from_torchrun,
    "slurm": _from_slurm,
    "submitit-local": _from_submitit_local,
    "single": _single,
}


def resolve_environment(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Resolve rank, world size, nodes and rendezvous address of this process.

    ``environ`` defaults to ``os.environ``. Precedence: torchrun > Slurm step > submitit local > single
    process; the chosen source and why it was chosen are logged (DEBUG here; the worker logs it at INFO).
    """
    env = os.environ if environ is None else environ
    source, why = detect_source(env)
    dist_env = _RESOLVERS[source](_Vars(env, source, why), socket.gethostname())
    log.debug(
        "rank resolution: source=%s (%s): rank %d/%d, local rank %d/%d, node %d/%d, master %s:%d",
        source,
        why,
        dist_env.rank,
        dist_env.world_size,
        dist_env.local_rank,
        dist_env.local_world_size,
        dist_env.node_rank,
        dist_env.num_nodes,
        dist_env.master_addr,
        dist_env.master_port,
    )
    return dist_env
