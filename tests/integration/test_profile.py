"""Cluster profiles and request checks on the real testbed: partition debug (2 CPU nodes, the default) and gpu
(1 node, 8 CPUs, 8 GB, 2 fake GPUs as GRES gpu:tesla, MaxTime 2 h)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ..readme_examples import prepare_cwd, user_repo_examples
from .conftest import cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

HPC_TRAIN = Path(sys.executable).parent / "hpc-train"
SMALL = ["data.num_samples=2048", "model.hidden_sizes=[32]", "trainer.max_steps=5", "trainer.progress_bar=false"]


@pytest.mark.generations
def test_profile_lists_both_partitions(tmp_path: Path) -> None:
    proc = cli("hpc_train.profile", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:4]}
    assert rows["debug*"] == ["debug*", "2", "0", "4", "4G", "unlimited", "yes", "UP"]
    assert rows["gpu"] == ["gpu", "1", "2", "(tesla)", "8", "8G", "02:00:00", "UP"]
    assert "accounts: root" in proc.stdout
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20).stdout.split()[-1]
    assert f"Slurm {version}\n" in proc.stdout  # the generation the testbed runs (pytest --slurm)


@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m hpc_train.profile --write tbgpu --partition gpu --dir DIR`: DIR/cluster/tbgpu.yaml."""
    conf = tmp_path_factory.mktemp("profiles")
    proc = cli("hpc_train.profile", "--write", "tbgpu", "--partition", "gpu", "--dir", str(conf), cwd=conf)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"hpc-train --config-dir {conf} cluster=tbgpu"
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20).stdout.split()[-1]
    assert f"slurm_version: {version}\n" in (conf / "cluster" / "tbgpu.yaml").read_text()
    return conf


def hpc_train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HPC_TRAIN), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.generations
def test_written_profile_runs_a_job(gpu_profile: Path, tmp_path: Path) -> None:
    """The profile's job lands on the gpu partition: 2 tasks (one per GPU), each seeing the node's 2 GRES GPUs."""
    text = (gpu_profile / "cluster" / "tbgpu.yaml").read_text()
    assert "partition: gpu" in text and "gpus_per_node: 2" in text and "cpus_per_task: 4" in text
    run_dir = tmp_path / "run"
    proc = hpc_train(
        "--config-dir",
        str(gpu_profile),
        "cluster=tbgpu",
        "cluster.wait=true",
        *SMALL,
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    table = json.loads((run_dir / "rank_table.json").read_text())
    assert [(r["host"], r["local_rank"], r["cuda_visible_devices"]) for r in table] == [
        ("node3", 0, "0,1"),
        ("node3", 1, "0,1"),
    ]
    assert (run_dir / "model_final.pt").is_file()


def _queued(name: str) -> str:
    """Every job of that name Slurm ever saw (accounting), and any still in the queue."""
    sacct = subprocess.run(
        ["sacct", "-n", "-X", "-o", "JobID", f"--name={name}"], capture_output=True, text=True, timeout=30
    )
    squeue = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=30)
    return (sacct.stdout + squeue.stdout).strip()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.gpus_per_node=4", "cluster.gpus_per_node=4 cannot run: the nodes of partition gpu have 2 GPUs"),
        (
            "cluster.cpus_per_task=8",
            "cluster.cpus_per_task=8 cannot run: 2 tasks x 8 CPUs = 16, but the nodes of partition gpu have 8 CPUs",
        ),
        (
            "cluster.timeout_min=500",
            "cluster.timeout_min=500.0 cannot run: partition gpu allows at most 120 minutes (MaxTime)",
        ),
        ("cluster.nodes=2", "cluster.nodes=2 cannot run: partition gpu has 1 nodes"),
        ("cluster.mem=16G", "cluster.slurm.mem='16G' cannot run: the nodes of partition gpu have 8192 MB"),
        (
            "cluster.partition=gpus",
            "cluster.slurm.partition='gpus' cannot run: there is no partition 'gpus' (asked Slurm just now). HINT: pick one of: all, debug, gpu",
        ),
        (
            "cluster.account=nosuch",
            "cluster.slurm.account='nosuch' cannot run: there is no account 'nosuch' (asked Slurm just now). HINT: pick one of: root",
        ),
        ("cluster.qos=nosuch", "HINT: pick one of: normal"),
    ],
)
def test_requests_beyond_the_limits_are_refused(gpu_profile: Path, tmp_path: Path, override: str, message: str) -> None:
    name = f"refused-{uuid.uuid4().hex[:8]}"
    args = ["--config-dir", str(gpu_profile), "cluster=tbgpu", override, f"cluster.job_name={name}", *SMALL]
    proc = hpc_train(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert _queued(name) == "", "a refused request reached Slurm"


def test_recorded_facts_check_a_dry_run_without_slurm(gpu_profile: Path, tmp_path: Path) -> None:
    """Where Slurm cannot be asked (scontrol missing from PATH), the profile's recorded facts still refuse."""
    import os

    env = {**os.environ, "PATH": "/usr/bin/no-slurm-here"}
    proc = subprocess.run(
        [
            str(HPC_TRAIN),
            "--config-dir",
            str(gpu_profile),
            "cluster=tbgpu",
            "cluster.dry_run=true",
            "cluster.gpus_per_node=3",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "gpus_per_node=3 cannot run: the nodes of partition gpu have 2 GPUs" in proc.stderr


@pytest.mark.parametrize("args", [a for a in user_repo_examples() if "cluster=mycluster" in a], ids=" ".join)
def test_user_repository_runs_on_the_testbed(args: list[str], tmp_path: Path) -> None:
    """README's user repository with its own cluster profile, model and experiment: a real 2 x 2 job whose
    setup line ran as shell on the first node."""
    repo = tmp_path / "myproject"
    repo.mkdir()
    prepare_cwd(repo)
    proc = hpc_train(*args, "hydra.run.dir=run", "trainer.max_steps=10", cwd=repo)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    table = json.loads((repo / "run" / "rank_table.json").read_text())
    assert sorted({r["host"] for r in table}) == ["node1", "node2"] and len(table) == 4
    record = json.loads((repo / "run" / "job.json").read_text())
    assert "sets up on node1" in Path(record["slurm_output"]).read_text()
    assert (repo / "run" / "model_final.pt").is_file()
