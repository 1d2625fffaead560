"""A thousand nodes on one machine: hpc_train's own control plane for N simulated nodes x 4 ranks.

    python benchmarks/scale.py --nodes 16 128 1024 --out scale-out

Every piece that runs is the product's code; only the ranks are stand-ins (threads of this process: no model,
no all-reduce, no 4,096 imports of torch). For each N it measures:
  resolve      rank resolution (``resolve_environment``) from the variables Slurm gives each rank: ms per rank
  rendezvous   the TCP-store rendezvous of every rank (``process_group._rendezvous``): seconds until all are in.
               torch's store clients look up a name for their logs as they connect; where the nameserver drops
               a burst of queries (this build machine's does, past ~16 at once) each waits for the resolver's
               timeout: 5 or 10 s here, whatever N (RES_OPTIONS='timeout:1 attempts:1' shortens it)
  status       steady training: each rank reports a heartbeat every --beat-s through its node
               (``RunDir.write_status`` with a ``NodeChannel``), one reporter per node; counted: file updates
               in the run dir's status/ per node per 10 s, beside the per-rank heartbeats that used to be files
  supervisor   what the supervisor reads after a step (``rank_statuses``, then ``classify``): seconds, peak MB
  teardown     one rank fails, then every other rank ends and says so through its node: seconds until the run
               dir shows every rank ended
  jobs status  ``python -m hpc_train.jobs status`` of the run dir, in this process: seconds
  rank table   rank 0's log lines for it (``summarize_rank_table``) and the seconds to write rank_table.json
  goodput      the goodput ledger over 20 attempts on N nodes: seconds
  sbatch       the job script for N nodes (``render_sbatch``): bytes
Then it flags any figure that grows faster than linearly in N (the exponent between the two largest N).
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch: thousands of store clients, one warning each

import argparse
import contextlib
import io
import json
import math
import resource
import shutil
import socket
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

from omegaconf import OmegaConf

import hpc_train.core.nodes as nodes
from hpc_train.api import compose_config
from hpc_train.config import resolve
from hpc_train.config.cluster import ClusterConfig
from hpc_train.core import files
from hpc_train.core.goodput import ledger
from hpc_train.core.nodes import NodeChannel
from hpc_train.core.records import Allocation, AttemptOutcome, AttemptRecord, Progress, RankState
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import format_table
from hpc_train.distributed import DistEnv, resolve_environment
from hpc_train.distributed.process_group import _rendezvous
from hpc_train.distributed.table import RankRow, summarize_rank_table
from hpc_train.launch.sbatch import job_spec, render_sbatch
from hpc_train.runtime.failures import SrunReport, classify
from hpc_train.tools.jobs import cmd_status

RANKS_PER_NODE = 4
JOB_ID = 4242


@dataclass
class Figures:
    nodes: int
    ranks: int
    resolve_ms_per_rank: float
    rendezvous_s: float
    heartbeats_per_node_per_10s: float
    """What each node's ranks report in steady training (each one a file update before #44)."""
    status_writes_per_node_per_10s: float
    """What the run dir's status/ now gets, per node."""
    supervisor_read_s: float
    supervisor_peak_mb: float
    teardown_s: float
    jobs_status_s: float
    rank_table_log_lines: int
    rank_table_write_s: float
    goodput_s: float
    sbatch_bytes: int


def host(node: int) -> str:
    return f"node{node:04d}"


def slurm_environ(n_nodes: int, rank: int, port: int) -> dict[str, str]:
    """The variables srun gives a task of an N-node step, 4 tasks a node (plus the address this machine has)."""
    node = rank // RANKS_PER_NODE
    return {
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % RANKS_PER_NODE),
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": host(node),
        "SLURM_STEP_NODELIST": f"node[0000-{n_nodes - 1:04d}]",
        "SLURM_STEP_TASKS_PER_NODE": f"{RANKS_PER_NODE}(x{n_nodes})",
        "SLURM_STEP_NUM_TASKS": str(n_nodes * RANKS_PER_NODE),
        "MASTER_ADDR": "127.0.0.1",  # node0000 is this machine
        "MASTER_PORT": str(port),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def resolve_ranks(n_nodes: int, port: int) -> tuple[list[DistEnv], float]:
    environs = [slurm_environ(n_nodes, r, port) for r in range(n_nodes * RANKS_PER_NODE)]
    start = time.perf_counter()
    envs = [resolve_environment(e) for e in environs]
    return envs, (time.perf_counter() - start) / len(envs) * 1e3


def rendezvous(envs: list[DistEnv]) -> float:
    """Every rank's rendezvous at once, each in a thread of its own (the store calls release the GIL)."""
    stores: list[object] = []
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(envs)) as pool:
        stores = list(pool.map(lambda env: _rendezvous(env, timedelta(seconds=300)), envs))
    elapsed = time.perf_counter() - start
    del stores
    return elapsed


class Node:
    """One simulated node: its channel and the run dir its ranks write through. Its reporter's work
    (``NodeChannel.tick``, what the reporter thread of the rank holding the node's lock runs every 0.5 s) is
    called by the benchmark's loop: a thousand such threads in one process would measure the GIL, not hpc_train."""

    def __init__(self, run: Path, shm: Path, index: int) -> None:
        self.host = host(index)
        status = run / "status"
        channel = NodeChannel(
            shm / self.host, status / f"node_{self.host}.json", host=self.host, run=str(run), local_ranks=4
        )
        channel.folder.mkdir(parents=True, exist_ok=True)
        self.ranks = range(index * RANKS_PER_NODE, (index + 1) * RANKS_PER_NODE)
        self.rd = RunDir(run, node=channel)
        self.channel = channel

    def beat(self, step: int, state: RankState = RankState.RUNNING) -> None:
        for rank in self.ranks:
            self.rd.write_status(rank, state, attempt=0, step=step)


@contextlib.contextmanager
def status_writes() -> Iterator[list[Path]]:
    """The files written into a run dir's status/ by the nodes' summaries while the block runs: their writer
    (``write_json_atomic`` as ``hpc_train.core.nodes`` calls it) is wrapped, so the product's code runs unchanged."""
    writes: list[Path] = []

    def counted(path: Path, obj: Any, durable: bool = True) -> None:
        if path.parent.name == "status":
            writes.append(path)
        files.write_json_atomic(path, obj, durable)

    with mock.patch.object(nodes, "write_json_atomic", counted):
        yield writes


def train(node_list: list[Node], seconds: float, beat_s: float) -> tuple[int, float]:
    """Every rank beats every ``beat_s`` for ``seconds``, each node's reporter ticking between the rounds as its
    thread would (every ``SOON_S / 2``); returns the heartbeats and the seconds it really took."""
    beats = step = 0
    start = next_tick = time.monotonic()
    while time.monotonic() - start < seconds:
        step += 1
        round_start = time.monotonic()
        for node in node_list:
            node.beat(step)
        beats += len(node_list) * RANKS_PER_NODE
        while time.monotonic() < round_start + beat_s or time.monotonic() >= next_tick:
            if time.monotonic() >= next_tick:
                now = time.monotonic()
                for node in node_list:
                    node.channel.tick(now)
                next_tick = now + nodes.SOON_S / 2
            time.sleep(max(0.0, min(next_tick, round_start + beat_s) - time.monotonic()))
    return beats, time.monotonic() - start


def steady(node_list: list[Node], seconds: float, beat_s: float, every_s: float) -> tuple[float, float]:
    """Heartbeats per node per 10 s, and status/ file updates per node per 10 s, over ``seconds``; each node's
    summary period is ``every_s`` (cluster.status_every_s)."""
    with status_writes() as writes:
        for node in node_list:
            node.channel.every_s = every_s
            node.beat(0)
            node.channel.tick(time.monotonic())  # the first summary, every rank running
        writes.clear()  # counted: steady training only
        beats, elapsed = train(node_list, seconds, beat_s)
    node_periods = len(node_list) * elapsed / 10  # nodes x 10-s periods
    return beats / node_periods, len(writes) / node_periods


def supervisor_read(rd: RunDir) -> tuple[float, float]:
    tracemalloc.start()
    start = time.perf_counter()
    statuses = rd.rank_statuses()
    classify(statuses, SrunReport.parse([]), 1)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return elapsed, peak


def teardown(node_list: list[Node], rd: RunDir, world: int, timeout_s: float = 600) -> float:
    """Rank 1 fails; every other rank then stops (as srun's SIGTERM makes it) and says so through its node."""
    start = time.perf_counter()
    node_list[0].rd.write_failure(1, RuntimeError("simulated failure"), attempt=0)

    def stop(node: Node) -> None:
        for rank in node.ranks:
            if rank != 1:
                node.rd.write_status(rank, RankState.STOPPED, attempt=0, signal=15)

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(stop, node_list))
    deadline = time.monotonic() + timeout_s
    while sum(not s.state.live for s in rd.rank_statuses().values()) < world:
        if time.monotonic() > deadline:
            raise SystemExit(f"teardown: not every rank ended within {timeout_s:g}s")
        time.sleep(0.05)
    return time.perf_counter() - start


def jobs_status(rd: RunDir, world: int) -> float:
    """``jobs status --json`` of the run dir, from its config to its verdict (no job id: no squeue to ask)."""
    shape = [f"cluster.nodes={world // RANKS_PER_NODE}", f"cluster.tasks_per_node={RANKS_PER_NODE}"]
    data = [f"data.num_samples={world * 20}", "trainer.batch_size=1"]  # samples for every rank, validation too
    cfg = compose_config("cluster=slurm", *shape, *data)
    rd.config.write_text(OmegaConf.to_yaml(OmegaConf.structured(resolve(cfg))))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        elapsed = timed(lambda: cmd_status([rd], as_json=True))
    state = json.loads(out.getvalue())[0]["state"]
    assert state in ("FAILED", "STOPPED"), state
    return elapsed


def rank_table(envs: list[DistEnv], rd: RunDir) -> tuple[int, float]:
    rows = [
        RankRow(
            host=e.hostname,
            rank=e.rank,
            local_rank=e.local_rank,
            node=e.node_rank,
            device=f"cuda:{e.local_rank}",
            backend="nccl",
            master=f"{e.master_addr}:{e.master_port}",
            source=e.source,
            pid=1000 + e.rank,
            cuda_visible_devices="0,1,2,3",
        )
        for e in envs
    ]
    lines = 1 + len(summarize_rank_table(rows).splitlines())  # with its heading line
    # What rank 0 does (runtime/worker.py): each row becomes its typed rank_table.json entry, then one write.
    return lines, timed(lambda: rd.write_rank_table([r.entry(attempt=0) for r in rows]))


def goodput(n_nodes: int) -> float:
    hosts = tuple(host(n) for n in range(n_nodes))
    attempts = [
        AttemptRecord(
            attempt=i,
            outcome=AttemptOutcome.STOPPED,
            job_id=str(JOB_ID),
            requeue=i,
            nodes=hosts,
            start=1000.0 * i,
            end=1000.0 * i + 900,
            progress=Progress(
                first_step=100 * i + 1, first_time=1000.0 * i + 60, step=100 * i + 100, time=1000.0 * i + 890
            ),
        )
        for i in range(20)
    ]
    allocations = [
        Allocation(job_id=str(JOB_ID), requeue=i, start=1000.0 * i, end=1000.0 * i + 950, nodes=hosts)
        for i in range(20)
    ]
    return timed(lambda: ledger(allocations, attempts, now=30_000.0))


def sbatch_bytes(n_nodes: int, run: Path) -> int:
    cluster = ClusterConfig(launcher="slurm", nodes=n_nodes, tasks_per_node=RANKS_PER_NODE)
    return len(render_sbatch(job_spec(cluster, [run], run)).encode())


def measure(n_nodes: int, seconds: float, beat_s: float, every_s: float, work: Path) -> Figures:
    run, shm = work / f"run-{n_nodes}", work / f"shm-{n_nodes}"
    run.mkdir(parents=True)
    world = n_nodes * RANKS_PER_NODE
    envs, resolve_ms = resolve_ranks(n_nodes, free_port())
    print(f"  {n_nodes} nodes: resolved {world} ranks, {resolve_ms:.3f} ms each", flush=True)
    rendezvous_s = rendezvous(envs)
    print(f"  {n_nodes} nodes: rendezvous {rendezvous_s:.2f}s", flush=True)
    node_list = [Node(run, shm, n) for n in range(n_nodes)]
    beats, writes = steady(node_list, seconds, beat_s, every_s)
    print(f"  {n_nodes} nodes: {writes:.2f} status/ writes per node per 10 s ({beats:.0f} heartbeats)", flush=True)
    rd = RunDir(run)
    supervisor_s, peak = supervisor_read(rd)
    teardown_s = teardown(node_list, rd, world)
    status_s = jobs_status(rd, world)
    lines, table_s = rank_table(envs, rd)
    return Figures(
        nodes=n_nodes,
        ranks=world,
        resolve_ms_per_rank=resolve_ms,
        rendezvous_s=rendezvous_s,
        heartbeats_per_node_per_10s=beats,
        status_writes_per_node_per_10s=writes,
        supervisor_read_s=supervisor_s,
        supervisor_peak_mb=peak,
        teardown_s=teardown_s,
        jobs_status_s=status_s,
        rank_table_log_lines=lines,
        rank_table_write_s=table_s,
        goodput_s=goodput(n_nodes),
        sbatch_bytes=sbatch_bytes(n_nodes, run),
    )


# What each figure should grow like: per node (1), per rank in all (1), or not at all (0). An exponent above it
# by more than the noise is flagged.
EXPECTED = {
    "resolve_ms_per_rank": 1.0,  # each rank expands the node list once: O(nodes) per rank, in parallel
    "rendezvous_s": 1.0,
    "heartbeats_per_node_per_10s": 0.0,
    "status_writes_per_node_per_10s": 0.0,
    "supervisor_read_s": 1.0,
    "supervisor_peak_mb": 1.0,
    "teardown_s": 1.0,
    "jobs_status_s": 1.0,
    "rank_table_log_lines": 0.0,
    "rank_table_write_s": 1.0,
    "goodput_s": 1.0,
    "sbatch_bytes": 0.0,
}


def growth(results: list[Figures]) -> dict[str, float]:
    """Each figure's exponent in N between the two largest N (f ~ N^k)."""
    small, large = results[-2], results[-1]
    ratio = large.nodes / small.nodes
    exponents = {}
    for key in EXPECTED:
        a, b = getattr(small, key), getattr(large, key)
        exponents[key] = math.log(b / a) / math.log(ratio) if a > 0 and b > 0 else 0.0
    return exponents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 128, 1024])
    parser.add_argument("--seconds", type=float, default=25.0, help="steady training window per N")
    parser.add_argument("--beat-s", type=float, default=1.0, help="each rank's heartbeat period (a logged row)")
    parser.add_argument(
        "--every-s", type=float, default=ClusterConfig().status_every_s, help="cluster.status_every_s (its default)"
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two sockets per simulated rank
    work = Path(tempfile.mkdtemp(prefix="hpc_train-scale-"))
    results: list[Figures] = []
    try:
        for n in args.nodes:
            print(f"{n} nodes x {RANKS_PER_NODE} ranks:", flush=True)
            results.append(measure(n, args.seconds, args.beat_s, args.every_s, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = list(EXPECTED)
    rows = [[k, *(_fmt(getattr(r, k)) for r in results)] for k in keys]
    flags: list[str] = []
    if len(results) >= 2:
        exponents = growth(results)
        for row, key in zip(rows, keys, strict=True):
            row.append(f"{exponents[key]:.2f} (expected {EXPECTED[key]:g})")
            if exponents[key] > EXPECTED[key] + 0.25 and getattr(results[-1], key) > 0:
                flags.append(f"{key} grows like N^{exponents[key]:.2f} (expected at most N^{EXPECTED[key]:g})")
    header = ["figure", *(f"N={r.nodes} ({r.ranks} ranks)" for r in results)]
    print(format_table(header + (["growth"] if len(results) >= 2 else []), rows))
    print("\n".join(f"FLAG: {f}" for f in flags) if flags else "no figure grows faster than expected")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    sys.exit(1 if flags else 0)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
