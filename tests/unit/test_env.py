"""resolve_environment: one table per source, precedence, overrides, ports and the errors users hit."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest

from hpc_train.core.errors import DistEnvironmentError
from hpc_train.distributed import PORT_BASE, PORT_SPAN, DistEnv, derive_port, resolve_environment


def slurm_task(
    procid: int,
    *,
    ntasks: int = 4,
    localid: int | None = None,
    nodeid: int | None = None,
    nodelist: str = "node[1-2]",
    tasks_per_node: str = "2(x2)",
    job_id: str = "4242",
    step_id: str = "0",
    nodename: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The variables srun sets for one task (2 nodes x 2 tasks unless told otherwise)."""
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": step_id,
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_LOCALID": str(procid % 2 if localid is None else localid),
        "SLURM_NODEID": str(procid // 2 if nodeid is None else nodeid),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
    }
    if nodename is not None:
        env["SLURMD_NODENAME"] = nodename
    return {**env, **extra}


def fields(env: DistEnv, *names: str) -> tuple[Any, ...]:
    return tuple(getattr(env, n) for n in names)


RANKS = ("rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes")


# ---- Slurm --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("procid", "expected"),
    [(0, (0, 0, 4, 2, 0, 2)), (1, (1, 1, 4, 2, 0, 2)), (2, (2, 0, 4, 2, 1, 2)), (3, (3, 1, 4, 2, 1, 2))],
)
def test_slurm_two_by_two(procid: int, expected: tuple[int, ...]) -> None:
    env = resolve_environment(slurm_task(procid))
    assert fields(env, *RANKS) == expected
    assert env.source == "slurm"
    assert env.master_addr == "node1"
    assert env.job_id == "4242"


@pytest.mark.parametrize(
    ("procid", "localid", "nodename", "expected_node", "expected_local_world"),
    [(0, 0, "cn01", 0, 2), (5, 1, "cn03", 2, 2), (6, 0, "cn04", 3, 1)],
)
def test_slurm_uneven_nodes(
    procid: int, localid: int, nodename: str, expected_node: int, expected_local_world: int
) -> None:
    """`2(x3),1`: three nodes with two tasks and a fourth with one."""
    env = resolve_environment(
        slurm_task(
            procid,
            ntasks=7,
            localid=localid,
            nodeid=expected_node,
            nodelist="cn[01-04]",
            tasks_per_node="2(x3),1",
            nodename=nodename,
        )
    )
    assert (env.node_rank, env.local_world_size, env.num_nodes, env.world_size) == (
        expected_node,
        expected_local_world,
        4,
        7,
    )
    assert env.hostname == nodename


def test_slurm_step_on_subset_of_job_nodes_uses_step_position() -> None:
    """SLURM_NODEID counts the job's nodes; a step on nodes 3-4 of a job must still see node ranks 0 and 1."""
    env = resolve_environment(
        slurm_task(1, ntasks=2, localid=0, nodeid=3, nodelist="n[3-4]", tasks_per_node="1(x2)", nodename="n4")
    )
    assert (env.node_rank, env.num_nodes, env.master_addr) == (1, 2, "n3")


def test_slurm_step_variables_win_over_job_variables() -> None:
    env = resolve_environment(
        slurm_task(
            0,
            ntasks=1,
            nodelist="n1",
            tasks_per_node="1",
            SLURM_JOB_NODELIST="n[1-8]",
            SLURM_TASKS_PER_NODE="4(x8)",
            SLURM_NTASKS="32",
        )
    )
    assert (env.world_size, env.num_nodes, env.local_world_size) == (1, 1, 1)


def test_slurm_job_variables_when_step_ones_absent() -> None:
    env = slurm_task(3)
    for name in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"):
        del env[name]
    assert fields(resolve_environment(env), *RANKS) == (3, 1, 4, 2, 1, 2)


def test_slurm_master_overrides() -> None:
    env = resolve_environment(slurm_task(2, MASTER_ADDR="10.0.0.7", MASTER_PORT="29500"))
    assert (env.master_addr, env.master_port) == ("10.0.0.7", 29500)


def test_slurm_every_rank_agrees_on_master() -> None:
    masters = {(e.master_addr, e.master_port) for e in (resolve_environment(slurm_task(r)) for r in range(4))}
    assert len(masters) == 1


def test_slurm_array_element_names_array_and_gets_its_own_port() -> None:
    a = resolve_environment(slurm_task(0, job_id="501", SLURM_ARRAY_JOB_ID="500", SLURM_ARRAY_TASK_ID="0"))
    b = resolve_environment(slurm_task(0, job_id="502", SLURM_ARRAY_JOB_ID="500", SLURM_ARRAY_TASK_ID="1"))
    assert (a.job_id, b.job_id) == ("500_0", "500_1")
    assert a.master_port != b.master_port


@pytest.mark.parametrize(
    ("launched", "missing"),
    [
        *[(lambda: slurm_task(0), name) for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID")],
        *[(lambda: torchrun_worker(1), name) for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "RANK")],
    ],
)
def test_missing_variable_is_named(launched: Callable[[], dict[str, str]], missing: str) -> None:
    env = launched()
    del env[missing]
    with pytest.raises(DistEnvironmentError, match=missing):
        resolve_environment(env)


def test_slurm_missing_nodelist_names_both_variables() -> None:
    env = slurm_task(0)
    del env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"]
    with pytest.raises(DistEnvironmentError, match="SLURM_JOB_NODELIST"):
        resolve_environment(env)


def test_slurm_malformed_value_is_named() -> None:
    with pytest.raises(DistEnvironmentError, match="SLURM_PROCID='one' is not an integer"):
        resolve_environment(slurm_task(0, SLURM_PROCID="one"))


def test_slurm_bad_nodelist_is_named() -> None:
    with pytest.raises(DistEnvironmentError, match=r"SLURM_STEP_NODELIST: invalid Slurm hostlist 'node\[3-1\]'"):
        resolve_environment(slurm_task(0, nodelist="node[3-1]"))


def test_slurm_task_counts_disagreeing_with_nodes() -> None:
    with pytest.raises(DistEnvironmentError, match="describes 3 nodes"):
        resolve_environment(slurm_task(0, tasks_per_node="2,1,1"))


def test_slurm_rank_out_of_range() -> None:
    with pytest.raises(DistEnvironmentError, match="0 <= rank < world_size"):
        resolve_environment(slurm_task(4))


# ---- torchrun -----------------------------------------------------------------------------------------------


def torchrun_worker(rank: int, local_world: int = 2, world: int = 4, **extra: str) -> dict[str, str]:
    return {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local_world),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29400",
        **extra,
    }


@pytest.mark.parametrize("rank", range(4))
def test_torchrun(rank: int) -> None:
    env = resolve_environment(torchrun_worker(rank))
    assert fields(env, *RANKS) == (rank, rank % 2, 4, 2, rank // 2, 2)
    assert (env.source, env.master_addr, env.master_port) == ("torchrun", "node1", 29400)


def test_torchrun_inside_srun_uses_torchrun_ranks() -> None:
    """`srun --ntasks-per-node=1 torchrun --nproc-per-node=4`: srun task 1 starts torchrun workers 4..7."""
    srun = slurm_task(1, ntasks=2, localid=0, nodeid=1, tasks_per_node="1(x2)")
    env = resolve_environment({**srun, **torchrun_worker(6, local_world=4, world=8)})
    assert env.source == "torchrun"
    assert fields(env, *RANKS) == (6, 2, 8, 4, 1, 2)


def test_rank_and_world_size_without_elastic_id_is_torchrun() -> None:
    env = torchrun_worker(1)
    del env["TORCHELASTIC_RUN_ID"]
    assert resolve_environment(env).source == "torchrun"


def test_torchrun_group_rank_defaults_from_rank() -> None:
    env = torchrun_worker(3)
    del env["GROUP_RANK"]
    assert resolve_environment(env).node_rank == 1


def test_torchrun_inhomogeneous_rejected() -> None:
    with pytest.raises(DistEnvironmentError, match="not a multiple of LOCAL_WORLD_SIZE"):
        resolve_environment(torchrun_worker(0, local_world=3, world=4))


# ---- submitit local and single ------------------------------------------------------------------------------


def submitit_local(rank: int, ntasks: int = 2, job_id: str = "777") -> dict[str, str]:
    return {
        "SUBMITIT_LOCAL_JOB_ID": job_id,
        "SUBMITIT_LOCAL_NTASKS": str(ntasks),
        "SUBMITIT_LOCAL_GLOBALID": str(rank),
        "SUBMITIT_LOCAL_LOCALID": str(rank),
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
    }


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_submitit_local(rank: int) -> None:
    env = resolve_environment(submitit_local(rank, ntasks=3))
    assert fields(env, *RANKS) == (rank, rank, 3, 3, 0, 1)
    assert (env.source, env.master_addr, env.master_port) == ("submitit-local", "127.0.0.1", derive_port(777))


def test_submitit_local_inside_a_slurm_allocation() -> None:
    """The local launcher used from an salloc shell: the allocation's variables must not make it fail."""
    env = resolve_environment({**submitit_local(1), "SLURM_JOB_ID": "9", "SLURM_NTASKS": "8"})
    assert (env.source, env.rank, env.world_size) == ("submitit-local", 1, 2)


def test_slurm_step_wins_over_submitit_local() -> None:
    assert resolve_environment({**submitit_local(1), **slurm_task(3)}).source == "slurm"


def test_single_process() -> None:
    env = resolve_environment({})
    assert fields(env, *RANKS) == (0, 0, 1, 1, 0, 1)
    assert (env.source, env.master_addr, env.is_main) == ("single", "127.0.0.1", True)


def test_single_inside_one_task_allocation_is_fine() -> None:
    env = resolve_environment({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "1"})
    assert (env.source, env.job_id) == ("single", "12")


def test_outside_a_step_with_several_tasks_says_use_srun() -> None:
    with pytest.raises(DistEnvironmentError, match=r"SLURM_NTASKS=4 but outside a job step.*HINT: launch .*srun"):
        resolve_environment({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"})


def test_none_reads_os_environ() -> None:
    with mock.patch.dict(os.environ, submitit_local(1, ntasks=2), clear=True):
        env = resolve_environment()
    assert (env.source, env.rank) == ("submitit-local", 1)


def test_source_and_reason_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="hpc_train.distributed.env"):
        resolve_environment(torchrun_worker(0))
    assert "source=torchrun (TORCHELASTIC_RUN_ID is set)" in caplog.text


# ---- ports --------------------------------------------------------------------------------------------------


def test_ports_stay_in_unprivileged_non_ephemeral_range() -> None:
    ports = [derive_port(job, step) for job in range(0, 200_000, 997) for step in (0, 1, 4294967294)]
    assert min(ports) >= PORT_BASE >= 1024
    assert max(ports) < PORT_BASE + PORT_SPAN <= 32768


@pytest.mark.parametrize("gap", [10_000, 20_000, 1, 100, 1000])
def test_job_ids_a_gap_apart_never_share_a_port(gap: int) -> None:
    """Lightning's `10000 + last four digits` gives jobs 1234 and 11234 the same port."""
    collisions = [job for job in range(1, 50_000) if derive_port(job, 0) == derive_port(job + gap, 0)]
    assert collisions == []


def test_port_depends_on_step() -> None:
    assert derive_port(1234, 0) != derive_port(1234, 1)
