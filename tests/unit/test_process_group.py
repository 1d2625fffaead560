"""Device choice, process-group lifetime and the rank table, in one process."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hpc_train.core.errors import DistEnvironmentError
from hpc_train.distributed import (
    DistEnv,
    RankRow,
    auto_uses_cuda,
    distributed,
    format_rank_table,
    gather_rank_table,
    resolve_environment,
    select_device,
    summarize_rank_table,
    teardown_distributed,
)


def env_with(local_rank: int, local_world_size: int, source: str = "slurm") -> DistEnv:
    return DistEnv(
        rank=local_rank,
        local_rank=local_rank,
        world_size=local_world_size,
        local_world_size=local_world_size,
        node_rank=0,
        num_nodes=1,
        master_addr="n1",
        master_port=20001,
        source=source,  # type: ignore[arg-type]
        hostname="n1",
    )


def test_cpu_when_cuda_not_wanted() -> None:
    assert select_device(env_with(1, 4), use_cuda=False) == torch.device("cpu")


@pytest.mark.parametrize(
    ("visible", "local_rank", "local_world", "expected"),
    [
        (4, 0, 4, "cuda:0"),
        (4, 3, 4, "cuda:3"),
        (1, 3, 4, "cuda:0"),  # per-task binding: every task sees only its own GPU
        (8, 2, 4, "cuda:2"),
    ],
)
def test_gpu_choice(
    monkeypatch: pytest.MonkeyPatch, visible: int, local_rank: int, local_world: int, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert select_device(env_with(local_rank, local_world), use_cuda=True) == torch.device(expected)


def test_more_tasks_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DistEnvironmentError, match=r"local rank 3 on n1 has no GPU of its own: 2 visible.*HINT"):
        select_device(env_with(3, 4), use_cuda=True)


@pytest.mark.parametrize("source", ["submitit-local", "torchrun"])
def test_local_ranks_may_not_share_one_gpu(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """Ranks a local launcher or torchrun starts all see the same GPU: NCCL would refuse them at init."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DistEnvironmentError, match=r"2 ranks on n1 would share its one visible GPU.*tasks_per_node=1"):
        select_device(env_with(1, 2, source), use_cuda=True)


@pytest.mark.parametrize(
    ("visible", "local_world", "source", "expected"),
    [
        (0, 1, "single", False),
        (1, 1, "single", True),
        (1, 2, "submitit-local", False),  # the default 2-rank job on a one-GPU workstation: CPU, with a warning
        (1, 2, "slurm", True),  # per-task binding
        (2, 4, "torchrun", False),
        (4, 4, "torchrun", True),
    ],
)
def test_auto_device(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    visible: int,
    local_world: int,
    source: str,
    expected: bool,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert auto_uses_cuda(env_with(0, local_world, source)) is expected
    assert ("trains on the CPU" in caplog.text) is (visible > 0 and not expected)


def test_no_gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(DistEnvironmentError, match="sees no GPU"):
        select_device(env_with(0, 1), use_cuda=True)


def test_single_process_group_lifecycle() -> None:
    env = resolve_environment({})
    device = torch.device("cpu")
    with distributed(env, device, timedelta(seconds=30)):
        assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
        rows = gather_rank_table(env, device)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    assert not dist.is_initialized()
    teardown_distributed()  # a second teardown is harmless
    assert [r.rank for r in rows] == [0] and rows[0].source == "single" and rows[0].backend == "gloo"
    text = format_rank_table(rows)
    header = ["host", "rank", "local", "node", "device", "backend", "MASTER_ADDR:PORT", "source"]
    assert text.splitlines()[0].split() == header
    assert text.splitlines()[1].split()[1:] == ["0", "0", "0", "cpu", "gloo", f"127.0.0.1:{env.master_port}", "single"]


def test_teardown_after_failure() -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        distributed(resolve_environment({}), torch.device("cpu"), timedelta(seconds=30)),
    ):
        raise RuntimeError("boom")
    assert not dist.is_initialized()


def _row(host: str, rank: int, local: int, device: str = "cpu", master: str = "n001:29500") -> RankRow:
    return RankRow(
        host=host,
        rank=rank,
        local_rank=local,
        node=rank // 4,
        device=device,
        backend="nccl",
        master=master,
        source="slurm",
        pid=1,
        cuda_visible_devices="",
    )


def test_a_large_rank_table_is_a_few_lines_in_hostlist_form_with_the_exceptions_named() -> None:
    rows = [_row(f"n{n + 1:03d}", n * 4 + g, g, f"cuda:{g}") for n in range(256) for g in range(4)]
    rows[-1] = _row("n256", 1023, 3, "cuda:3", master="n999:29500")  # disagrees on the master
    rows = [r for r in rows if r.rank != 1022]  # a node that runs 3 ranks
    text = summarize_rank_table(rows)
    lines = text.splitlines()
    assert len(lines) == 5, text
    assert lines[0] == "1023 ranks on 256 nodes; backend nccl, MASTER_ADDR:PORT n001:29500, from slurm"
    assert lines[1] == "  n[001-255]: 255 nodes x 4 ranks (cuda:0-3), ranks 0-1019"
    assert lines[2] == "  n256: 1 node x 3 ranks (cuda:0,1,3), ranks 1020,1021,1023"
    assert lines[3] == "  differing from the rest: rank 1023 on n256: nccl n999:29500 from slurm"
    assert "rank_table.json" in lines[4]


def test_a_small_rank_table_is_printed_whole() -> None:
    rows = [_row("a", 0, 0), _row("b", 1, 0)]
    assert summarize_rank_table(rows) == format_rank_table(rows)
