"""Cluster facts from Slurm's own words, requests checked against them, and cluster profiles written from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.api import compose_config
from hpc_train.config import ClusterConfig, mem_mb
from hpc_train.core.errors import ConfigError
from hpc_train.core.searchpath import ENV_VAR
from hpc_train.launch.facts import (
    ClusterFacts,
    check_request,
    explain_slurm_refusal,
    gres_gpus,
    parse_cluster,
    read_live,
    slurm_minutes,
)
from hpc_train.tools.profile import profile_yaml, table

# Trimmed `scontrol show partition -o` / `scontrol show node -o` lines in Slurm 22.05's format.
PARTITIONS = """\
PartitionName=cpu AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=c[1-4] State=UP TotalCPUs=256 TotalNodes=4
PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=2-00:00:00 Nodes=g[1-2] State=UP TotalCPUs=128 TotalNodes=2
PartitionName=short AllowGroups=ALL MaxTime=30:00 Nodes=c[1-4],g[1-2] State=UP TotalNodes=6
"""
NODES = "".join(
    f"NodeName={name} Arch=x86_64 CPUTot={cpus} Gres={gres} RealMemory={mem} State=IDLE Partitions={parts}\n"
    for name, cpus, gres, mem, parts in [
        *[(f"c{i}", 64, "(null)", 256000, "cpu,short") for i in range(1, 5)],
        *[(f"g{i}", 64, "gpu:a100:4(S:0-1)", 512000, "gpu,short") for i in range(1, 3)],
    ]
)


@pytest.fixture
def facts() -> ClusterFacts:
    return ClusterFacts(parse_cluster(PARTITIONS, NODES), ("proj1", "proj2"), ("normal", "high"), "scontrol")


def test_partitions_from_scontrol(facts: ClusterFacts) -> None:
    cpu, gpu, short = (facts.partitions[n] for n in ("cpu", "gpu", "short"))
    assert (cpu.nodes, cpu.gpus, cpu.cpus, cpu.mem_mb, cpu.max_time_min, cpu.default) == (4, 0, 64, 256000, None, True)
    assert (gpu.nodes, gpu.gpus, gpu.gpu_types, gpu.max_time_min, gpu.default) == (2, 4, ("a100",), 2880, False)
    assert (short.nodes, short.gpus, short.max_time_min) == (6, 4, 30)
    assert facts.default_partition is cpu
    text = table(facts)
    assert text.splitlines()[1].split()[:2] == ["cpu*", "4"] and "4 (a100)" in text and "2-00:00:00" in text


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("(null)", (0, ())),
        ("gpu:4", (4, ())),
        ("gpu:a100:4(S:0-1)", (4, ("a100",))),
        ("gpu:a100:2,gpu:v100:2,nic:1", (4, ("a100", "v100"))),
        ("gpu:tesla:2(S:0,1)", (2, ("tesla",))),
    ],
)
def test_gres(gres: str, expected: tuple[int, tuple[str, ...]]) -> None:
    assert gres_gpus(gres) == expected


@pytest.mark.parametrize(
    ("value", "minutes"),
    [("UNLIMITED", None), ("60", 60), ("30:00", 30), ("2:00:00", 120), ("1-12:00:00", 2160), ("1-12", 2160)],
)
def test_slurm_times(value: str, minutes: float | None) -> None:
    assert slurm_minutes(value) == minutes


def test_memory_sizes() -> None:
    assert [mem_mb(v) for v in ("500M", "64G", "1T", "2048", "0")] == [500, 65536, 1048576, 2048, 0]


def slurm(**values: object) -> ClusterConfig:
    return ClusterConfig(launcher="slurm", **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"partition": "gpus"},
            r"cluster\.slurm\.partition='gpus' cannot run: there is no partition .*pick one of: cpu, gpu, short",
        ),
        ({"account": "nobody"}, r"cluster\.slurm\.account='nobody'.*pick one of: proj1, proj2"),
        ({"qos": "urgent"}, r"cluster\.slurm\.qos='urgent'.*pick one of: high, normal"),
        (
            {"gpus_per_node": 4},
            r"gpus_per_node=4 cannot run: the nodes of partition cpu \(the default\) have 0 GPUs.*cluster\.slurm\.partition=gpu",
        ),
        (
            {"partition": "gpu", "gpus_per_node": 8},
            r"gpus_per_node=8 cannot run: the nodes of partition gpu have 4 GPUs\. HINT: set cluster\.gpus_per_node=4",
        ),
        (
            {"tasks_per_node": 4, "cpus_per_task": 32},
            r"cpus_per_task=32 cannot run: 4 tasks x 32 CPUs = 128, but .* have 64 CPUs\. HINT: set cluster\.cpus_per_task=16",
        ),
        (
            {"partition": "short", "timeout_min": 60},
            r"timeout_min=60.*allows at most 30 minutes \(MaxTime\)\. HINT: set cluster\.timeout_min=30",
        ),
        (
            {"nodes": 5},
            r"cluster\.nodes=5 cannot run: partition cpu \(the default\) has 4 nodes\. HINT: set cluster\.nodes=4",
        ),
        (
            {"mem": "300G"},
            r"cluster\.slurm\.mem='300G' cannot run: the nodes of partition cpu \(the default\) have 256000 MB",
        ),
    ],
)
def test_impossible_requests_are_refused(facts: ClusterFacts, values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_request(slurm(**values), facts)


def test_possible_requests_pass(facts: ClusterFacts) -> None:
    check_request(slurm(partition="gpu", nodes=2, gpus_per_node=4, cpus_per_task=16, mem="500G"), facts)
    check_request(slurm(nodes=4, tasks_per_node=2, cpus_per_task=32, account="proj2", qos="high"), facts)


def test_without_accounting_accounts_are_not_checked() -> None:
    facts = ClusterFacts(parse_cluster(PARTITIONS, NODES), None, None, "scontrol")
    check_request(slurm(account="anything", qos="anything"), facts)


def test_live_reading_goes_through_scontrol_and_sacctmgr() -> None:
    answers = {
        "partition": PARTITIONS,
        "node": NODES,
        "account": "proj1|\nproj2|\n",
        "qos": "normal\n",
        "--version": "slurm-wlm 24.11.5\n",
    }
    asked: list[list[str]] = []

    def ask(argv: list[str]) -> str | None:
        asked.append(argv)
        return next(text for key, text in answers.items() if key in argv or f"format={key}" in argv)

    facts = read_live(ask)
    assert facts is not None and set(facts.partitions) == {"cpu", "gpu", "short"}
    assert (facts.accounts, facts.qos) == (("proj1", "proj2"), ("normal",))
    assert facts.slurm_version == "24.11.5"  # recorded in a profile, and read back from it
    assert ClusterFacts.from_record(facts.to_record(), "a profile").slurm_version == "24.11.5"
    assert ClusterFacts.from_record({"partitions": {}}, "an older profile").slurm_version is None
    assert read_live(lambda argv: None) is None  # no Slurm here: nothing to check against
    assert asked[0][:2] == ["scontrol", "show"]


def test_slurm_refusals_name_the_key() -> None:
    assert "HINT: change cluster.slurm.partition" in explain_slurm_refusal(
        "sbatch: error: invalid partition specified: x"
    )
    assert "cluster.nodes, gpus_per_node" in explain_slurm_refusal(
        "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    )


def test_written_profile_composes_and_keeps_the_facts(
    facts: ClusterFacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cluster").mkdir()
    text = profile_yaml("mycluster", facts.partitions["gpu"], facts, "2026-11-23T10:00:00")
    (tmp_path / "cluster" / "mycluster.yaml").write_text(text)
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    cfg = compose_config("cluster=mycluster")
    c = cfg.cluster
    assert (c.launcher, c.partition, c.gpus_per_node, c.tasks_per_node, c.cpus_per_task) == ("slurm", "gpu", 4, 4, 16)
    recorded = ClusterFacts.from_record(dict(c.facts), "profile")
    assert recorded.partitions == facts.partitions and recorded.accounts == facts.accounts
    with pytest.raises(ConfigError, match=r"gpus_per_node=8 cannot run: the nodes of partition gpu have 4 GPUs"):
        check_request(compose_config("cluster=mycluster", "cluster.gpus_per_node=8").cluster, recorded)


def test_profile_shows_memory_to_a_tenth_of_a_gigabyte(facts: ClusterFacts) -> None:
    import dataclasses

    odd = dataclasses.replace(facts.partitions["cpu"], mem_mb=9642)
    rows = table(dataclasses.replace(facts, partitions={"cpu": odd})).splitlines()
    assert rows[1].split()[4] == "9.4G"
    assert table(facts).splitlines()[1].split()[4] == "250G"
