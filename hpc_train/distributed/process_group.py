"""The one place that creates and destroys the default process group, and picks this rank's device."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hpc_train.core.errors import DistEnvironmentError
from hpc_train.core.textutil import number_ranges
from hpc_train.distributed.env import DistEnv

__all__ = ["auto_uses_cuda", "distributed", "init_distributed", "select_device", "teardown_distributed"]

log = logging.getLogger(__name__)


def select_device(env: DistEnv, use_cuda: bool) -> torch.device:
    """CPU, or the GPU this rank owns.

    With several GPUs visible, local rank k takes ``cuda:k``. When each task sees exactly one GPU (Slurm's
    per-task binding, ``--gpus-per-task=1``, sets a different CUDA_VISIBLE_DEVICES per task) it is ``cuda:0``.
    """
    if not use_cuda:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if count == 0:
        raise DistEnvironmentError(
            f"trainer.device asks for CUDA but rank {env.rank} on {env.hostname} sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={visible}). HINT: request GPUs (cluster.gpus_per_node) or set trainer.device=cpu."
        )
    if count == 1:
        if _shares_one_gpu(env):
            raise DistEnvironmentError(
                f"{env.local_world_size} ranks on {env.hostname} would share its one visible GPU "
                f"(CUDA_VISIBLE_DEVICES={visible}), and NCCL takes one rank per GPU. HINT: set "
                "cluster.tasks_per_node=1 to train on the GPU, or trainer.device=cpu for several CPU ranks."
            )
        return torch.device("cuda", 0)
    if env.local_rank >= count:
        raise DistEnvironmentError(
            f"local rank {env.local_rank} on {env.hostname} has no GPU of its own: {count} visible "
            f"(CUDA_VISIBLE_DEVICES={visible}) for {env.local_world_size} tasks on this node. HINT: set "
            "cluster.tasks_per_node to at most cluster.gpus_per_node, or bind one GPU per task."
        )
    return torch.device("cuda", env.local_rank)


def _shares_one_gpu(env: DistEnv) -> bool:
    """Several local ranks that see the same single GPU. Processes a local launcher or torchrun starts on one
    machine inherit one CUDA_VISIBLE_DEVICES; under an srun step a single visible GPU is per-task binding (each
    task sees its own), so only Slurm's ranks may each see one GPU."""
    return env.local_world_size > 1 and env.source != "slurm"


def auto_uses_cuda(env: DistEnv) -> bool:
    """``trainer.device=auto``: CUDA when every local rank can have a GPU of its own, else the CPU (logged).

    The default local job has 2 ranks; on a one-GPU workstation they would share the GPU, which NCCL refuses.
    """
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return False
    if count < env.local_world_size and (count > 1 or _shares_one_gpu(env)):
        log.warning(
            "trainer.device=auto: %d local ranks but %d GPU(s) visible, so this run trains on the CPU. HINT: set "
            "cluster.tasks_per_node=%d to use the GPUs",
            env.local_world_size,
            count,
            count,
        )
        return False
    return True


def init_distributed(
    env: DistEnv,
    device: torch.device,
    timeout: timedelta,
    preflight: timedelta | None = None,
    on_rendezvous: Callable[[], None] | None = None,
) -> None:
    """Create the default process group: nccl for GPUs, gloo for CPUs; ``timeout`` bounds every collective.

    A one-process job uses an in-memory store, so it binds no port and works where networking is locked down.
    Before that, a preflight (bounded by ``preflight``, default ``timeout``) checks that every rank reached the
    store, then that a tiny all-reduce goes through; a failure names the ranks that arrived and the address.
    ``on_rendezvous`` is called once every rank has reached the store (the start-up profile's mark).
    """
    preflight = preflight or timeout
    if dist.is_initialized():
        raise RuntimeError("the default process group is already initialised")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # torch's stubs do not re-export the store classes (they live in torch._C): hence the ignores below.
    store: Any
    if env.world_size == 1:
        store = dist.HashStore()  # type: ignore[attr-defined]
    else:
        store = _rendezvous(env, preflight)
        store.set_timeout(timeout)
    if on_rendezvous is not None:
        on_rendezvous()
    log.info(
        "init_process_group: backend=%s rank=%d world_size=%d store=%s:%d timeout=%ss",
        backend,
        env.rank,
        env.world_size,
        env.master_addr,
        env.master_port,
        timeout.total_seconds(),
    )
    dist.init_process_group(
        backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    if env.world_size > 1:
        _first_all_reduce(env, device, preflight)


def _where(env: DistEnv) -> str:
    return f"MASTER_ADDR:MASTER_PORT={env.master_addr}:{env.master_port}"


def _rendezvous(env: DistEnv, timeout: timedelta) -> Any:
    """The TCPStore, once every rank has checked in; DistEnvironmentError naming the missing ranks otherwise."""
    store: Any
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            env.master_addr,
            env.master_port,
            world_size=env.world_size,
            is_master=env.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        role = "could not listen on" if env.rank == 0 else "could not reach rank 0's store at"
        raise DistEnvironmentError(
            f"preflight: rank {env.rank} on {env.hostname} {role} {_where(env)} within {timeout.total_seconds():g}s "
            f"({str(exc).splitlines()[0][:200]}). HINT: check that rank 0 started and that {env.master_addr} is "
            "reachable from this node; trainer.preflight_timeout_s sets the wait"
        ) from None
    # One counter and one flag, not a key per rank that every rank waits on: that would be world_size**2 keys
    # through the one store process (16 million at 4,096 ranks).
    store.append("hpc_train/arrived", f"{env.rank},")
    if store.add("hpc_train/count", 1) == env.world_size:
        store.set("hpc_train/all_arrived", "1")
    try:
        store.wait(["hpc_train/all_arrived"], timeout)
    except RuntimeError:
        raise DistEnvironmentError(_missing(env, store, timeout)) from None
    return store


def _missing(env: DistEnv, store: Any, timeout: timedelta) -> str:
    """Which ranks had reached the store when the rendezvous timed out (ranges: a line at any scale)."""
    listed = store.get("hpc_train/arrived").decode().strip(",")
    arrived = sorted({int(r) for r in listed.split(",") if r.isdigit()})
    missing = sorted(set(range(env.world_size)) - set(arrived))
    return (
        f"preflight: after {timeout.total_seconds():g}s only ranks {_ranges(arrived)} of {env.world_size} had "
        f"reached the store at {_where(env)}; missing: ranks {_ranges(missing)} ({len(missing)}). HINT: a missing "
        "rank failed before the rendezvous (see its log) or cannot reach the master node"
    )


def _first_all_reduce(env: DistEnv, device: torch.device, timeout: timedelta) -> None:
    """One tiny all-reduce: the store works, but the data path (another interface, a firewall) may not."""
    ones = torch.ones(1, device=device)
    work = dist.all_reduce(ones, async_op=True)
    try:
        ok = work is not None and work.wait(timeout) and int(ones.item()) == env.world_size
    except RuntimeError as exc:
        raise DistEnvironmentError(
            f"preflight: a first all-reduce over {env.world_size} ranks failed on rank {env.rank} "
            f"({str(exc).splitlines()[0][:200]}); rendezvous was {_where(env)}. HINT: the nodes reach the store "
            "but not each other: check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME"
        ) from None
    if not ok:
        raise DistEnvironmentError(f"preflight: the first all-reduce summed to {ones.item()}, not {env.world_size}")


def _ranges(ranks: list[int]) -> str:
    return number_ranges(ranks) or "none"


def teardown_distributed() -> None:
    """Destroy the default process group if there is one (safe to call twice, and after a failure)."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def distributed(
    env: DistEnv,
    device: torch.device,
    timeout: timedelta,
    preflight: timedelta | None = None,
    on_rendezvous: Callable[[], None] | None = None,
) -> Iterator[None]:
    """``init_distributed`` on entry, ``teardown_distributed`` on exit, whatever happens in between."""
    init_distributed(env, device, timeout, preflight, on_rendezvous)
    try:
        yield
    finally:
        teardown_distributed()
