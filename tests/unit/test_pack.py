"""Packing (``cluster.pack``) without Slurm: the request, the script that hands each array element its members,
the checks, each member's share of the allocation, and the pack's supervisor over member supervisors that are
stand-ins (the real ones, on the testbed: tests/integration/test_pack_slurm.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpc_train.config import ClusterConfig
from hpc_train.core.errors import ConfigError
from hpc_train.core.files import write_json_atomic
from hpc_train.core.identity import PACK_VARIABLE
from hpc_train.core.records import AttemptOutcome, AttemptRecord
from hpc_train.core.rundir import RunDir
from hpc_train.launch.facts import ClusterFacts, Partition, check_pack
from hpc_train.launch.sbatch import job_spec, render_sbatch, sbatch_flags
from hpc_train.runtime.faults import fault_from_env
from hpc_train.runtime.pack import member_srun_options, run_pack

HOSTILE = "a$(touch x);`touch x`'q\"d"


def slurm(**overrides: object) -> ClusterConfig:
    return ClusterConfig(launcher="slurm", **overrides).resolved()  # type: ignore[arg-type]


def test_a_pack_asks_for_its_members_resources_together() -> None:
    flags = sbatch_flags(slurm(nodes=2, tasks_per_node=2, gpus_per_node=2, mem="8G"), pack=3)
    assert (flags["nodes"], flags["ntasks-per-node"], flags["gpus-per-node"], flags["mem"]) == ("2", "6", "6", "24576M")
    flags = sbatch_flags(slurm(gpus_per_node=2, gpu_binding="task", mem="0"), pack=2)
    assert (flags["ntasks-per-node"], flags["gpus-per-task"], flags["mem"]) == ("4", "1", "0")  # 0: all, as before
    assert sbatch_flags(slurm(mem="8G"), pack=1)["mem"] == "8G"


def _fake_python(bin_dir: Path) -> str:
    """A python that records its arguments, one per line."""
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGS"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return str(python)


def test_each_array_element_gets_its_own_members(tmp_path: Path) -> None:
    """5 points in packs of 2: elements 0-2, the last a pack of one; names full of shell stay inert."""
    dirs = [tmp_path / f"{i} {HOSTILE}" for i in range(5)]
    for d in dirs:
        d.mkdir()
    python = _fake_python(tmp_path / "bin")
    script = tmp_path / "job.sbatch"
    spec = job_spec(slurm(), dirs, tmp_path, python=python, pack=2)
    script.write_text(render_sbatch(spec))
    text = script.read_text()
    assert "#SBATCH --array=0-2" in text and "#SBATCH --ntasks-per-node=2" in text
    for element, members in ((0, dirs[:2]), (1, dirs[2:4]), (2, dirs[4:])):
        env = {**os.environ, "SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": str(element), "ARGS": str(tmp_path / "args")}
        subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
        args = (tmp_path / "args").read_text().splitlines()
        assert args == ["-u", "-m", "hpc_train.supervisor", "--pack", *map(str, members)]
    assert not list(tmp_path.rglob("x")), "a quoted value was executed"
    assert not any((d / "status" / "batch_exit.json").exists() for d in dirs)  # the pack's supervisor writes those
    # Fewer points than cluster.pack: one job (no array) of those points only.
    one = job_spec(slurm(), dirs[:2], tmp_path, pack=4)
    assert (one.pack, one.is_array, one.flags["ntasks-per-node"]) == (2, False, "2")
    assert "--array" not in render_sbatch(one)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"launcher": "local"},
            "cluster.launcher=local runs them here.*HINT: set cluster.pack=1, or use cluster=slurm",
        ),
        ({"launcher": "slurm", "submit": "here"}, "submit=here trains in the allocation this shell holds"),
        ({"launcher": "slurm", "spare_nodes": 1}, "spare .*HINT: set cluster.pack=1 to keep spares"),
        ({"launcher": "slurm", "nodes": 2, "min_nodes": 1}, "min_nodes"),
    ],
)
def test_packing_is_refused_where_it_cannot_work(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.pack=2.*" + says):
        ClusterConfig(pack=2, **overrides)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"cluster\.pack=0 .*whole number from 1"):
        ClusterConfig(launcher="slurm", pack=0)


def test_a_pack_that_does_not_fit_a_node_names_cluster_pack_and_the_most_that_fits() -> None:
    part = Partition(
        name="debug", nodes=2, cpus=4, mem_mb=8000, gpus=2, gpu_types=(), max_time_min=None, default=True, state="up"
    )
    facts = ClusterFacts(partitions={"debug": part}, accounts=None, qos=None, source="Slurm")
    check_pack(slurm(tasks_per_node=1, cpus_per_task=2), facts, 2)
    with pytest.raises(ConfigError, match=r"cluster\.pack=3 .*3 members x 2 CPUs each = 6 CPUs on each node, but the "):
        check_pack(slurm(tasks_per_node=1, cpus_per_task=2), facts, 3)
    with pytest.raises(ConfigError, match=r"1 GPUs each = 3 GPUs .*HINT: set cluster.pack=2 or fewer"):
        check_pack(slurm(gpus_per_node=1), facts, 3)
    with pytest.raises(ConfigError, match=r"6000 MB of memory each .*set cluster.pack=1 \(a member alone fills"):
        check_pack(slurm(mem="6000M"), facts, 2)


def test_a_member_step_takes_only_its_share() -> None:
    environ = {PACK_VARIABLE: "1/2", "SLURM_MEM_PER_NODE": "8000"}
    got = member_srun_options(slurm(gpus_per_node=1), environ)
    assert got == ["--exact", "--job-name=member1", "--gpus-per-node=1", "--mem=4000M"]
    task = slurm(gpus_per_node=2, gpu_binding="task")
    assert member_srun_options(task, {PACK_VARIABLE: "0/3"}) == ["--exact", "--job-name=member0", "--gpus-per-task=1"]
    assert member_srun_options(slurm(), {"SLURM_MEM_PER_NODE": "8000"}) == []  # not in a pack: as before


def test_a_fault_can_be_armed_in_one_member() -> None:
    raw = "member=1,rank=0,step=3,kind=raise"
    assert fault_from_env(raw, 0, member=0) is None and fault_from_env(raw, 0, member=None) is None
    assert fault_from_env(raw, 0, member=1) is not None


def test_the_pack_supervisor_skips_ended_members_and_keeps_each_status(tmp_path: Path) -> None:
    """Five members: one completed and one ended fatally in an earlier allocation, one cancelled alone
    (skipped); two run, through a stand-in supervisor that exits with its member's status; each gets its
    batch_exit.json."""
    from hpc_train.api import compose_config
    from hpc_train.launch import write_config

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    # The stand-in: the member's run dir and PACK_VARIABLE into the run dir; exits 3 for the member named "fails".
    python.write_text(
        "#!/bin/bash\n"
        'dir="${@: -1}"\n'
        f'echo "$@ ${PACK_VARIABLE}" > "$dir/ran"\n'
        'case "$dir" in *fails) exit 3;; esac\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    cfg = compose_config("cluster=slurm", f"cluster.slurm.python={python}")
    members = [RunDir(tmp_path / name) for name in ("done", "fatal", "trains", "fails", "cancelled")]
    outcomes = (AttemptOutcome.COMPLETED, AttemptOutcome.FATAL, AttemptOutcome.FAILED, None, AttemptOutcome.FAILED)
    for rd, outcome in zip(members, outcomes, strict=True):
        write_config(cfg, rd)
        if outcome is not None:
            record = AttemptRecord(attempt=0, outcome=outcome, job_id="41")
            write_json_atomic(rd.attempts, [record.to_json()])
    members[4].request_cancel()  # `jobs cancel` of that member alone
    code = run_pack([rd.path for rd in members], {**os.environ, "SLURM_JOB_ID": "42"})
    assert code == 3
    assert [(rd.path / "ran").exists() for rd in members] == [False, False, True, True, False]
    assert (members[2].path / "ran").read_text().split() == [
        *["-u", "-m", "hpc_train.supervisor", "--run-dir", str(members[2].path), "2/5"]
    ]
    assert [json.loads(rd.batch_exit.read_text())["exit_code"] for rd in members[2:4]] == [0, 3]
    assert not members[0].batch_exit.exists() and not members[4].batch_exit.exists()


def test_the_pack_ledger_counts_the_jobs_once_and_every_member_s_training() -> None:
    """Two members in one job, requeued once: the pack held 100 s + 50 s for each of 2 members (300
    member-seconds), of which they trained 80 + 40 + 60: ETTR 0.6."""
    from dataclasses import replace

    from hpc_train.core.goodput import GoodputLedger, ledger, pack_ledger
    from hpc_train.core.records import Allocation

    def trained(seconds: float) -> GoodputLedger:
        """A member's own ledger that counts ``seconds`` productive."""
        return replace(ledger([], [], now=0.0), productive_s=seconds)

    first = [Allocation(job_id="5", start=100.0, end=200.0), Allocation(job_id="5", requeue=1, start=300, end=340)]
    second = [Allocation(job_id="5", start=101.0, end=150.0), Allocation(job_id="5", requeue=1, start=301, end=350)]
    got = pack_ledger([first, second], [trained(80.0 + 60.0), trained(40.0)])
    assert got.to_json() == {"members": 2, "allocations": 2, "wall_s": 150.0, "productive_s": 180.0, "ettr": 0.6}
    # A member with no attempt yet counts for none of the training but for its share of the time held.
    with_job = pack_ledger([first, second, []], [trained(180.0), None, None], job_id="5")
    assert (with_job.members, with_job.productive_s, with_job.ettr) == (3, 180.0, 0.4)
    assert with_job.to_json()["job_id"] == "5"
