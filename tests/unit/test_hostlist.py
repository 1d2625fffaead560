"""expand_hostlist and parse_tasks_per_node: tables of valid and invalid input, checked against scontrol."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_train.distributed import expand_hostlist, parse_tasks_per_node

VALID = [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("n[09-11]", ["n09", "n10", "n11"]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    # Lightning's regex returns "node1" here; Slurm expands both groups, the first varying slowest.
    ("node[1-2]-ib[3-4]", ["node1-ib3", "node1-ib4", "node2-ib3", "node2-ib4"]),
    ("a[1-2],b[3,5-6]", ["a1", "a2", "b3", "b5", "b6"]),
    ("node[1,1,2]", ["node1", "node1", "node2"]),
    ("node[1-2],node1", ["node1", "node2", "node1"]),
    ("n[7,1-2]", ["n7", "n1", "n2"]),
    ("gpu-a100-[01-02]", ["gpu-a100-01", "gpu-a100-02"]),
    ("host.example.com", ["host.example.com"]),
    ("a,b,a", ["a", "b", "a"]),
    ("n[0-0]", ["n0"]),
]

INVALID = ["node[3-1]", "node-[a-c]", "node[]", "node[1-2", "node1]", "", " node1", "node1 node2"]


@pytest.mark.parametrize(("expr", "hosts"), VALID)
def test_expand_valid(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", INVALID)
def test_expand_invalid_names_the_expression(expr: str) -> None:
    with pytest.raises(ValueError, match="invalid Slurm hostlist") as info:
        expand_hostlist(expr)
    assert repr(expr) in str(info.value)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """scontrol and a minimal slurm.conf: `show hostnames` needs a config source even for pure expansion."""
    exe = shutil.which("scontrol")
    if exe is None:
        pytest.skip("scontrol is not installed (scripts/test.sh installs Slurm; plain pytest may not have it)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n"
    )
    return exe, conf


@pytest.mark.parametrize(("expr", "hosts"), VALID)
def test_matches_scontrol(expr: str, hosts: list[str], scontrol: tuple[str, Path]) -> None:
    exe, conf = scontrol
    env = {"SLURM_CONF": str(conf)}
    out = subprocess.run([exe, "show", "hostnames", expr], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == hosts == expand_hostlist(expr)


@pytest.mark.parametrize(
    ("expr", "counts"),
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]), ("8(x1)", [8]), ("2,2", [2, 2])],
)
def test_tasks_per_node(expr: str, counts: list[int]) -> None:
    assert parse_tasks_per_node(expr) == counts


@pytest.mark.parametrize("expr", ["", "2(x3", "x", "2(x0)", "2(3)", "-1", "2(x3),"])
def test_tasks_per_node_invalid(expr: str) -> None:
    with pytest.raises(ValueError, match="invalid task count list"):
        parse_tasks_per_node(expr)
