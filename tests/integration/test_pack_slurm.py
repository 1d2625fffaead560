"""Packing on the real testbed (``cluster.pack``): the points of a sweep share Slurm jobs, run side by side as
job steps of their own, and each keeps every guarantee of an unpacked run: the same weights to the last bit,
a stop that every member checkpoints with one requeue for the pack, and a failure that is its member's alone.

Each member is 1 node x 1 task: a debug node has 4 CPUs, so a pack of 2 or 3 fits one node and the 2-core
machine under the testbed runs a member's rank beside the other's."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpc_train.core.errors import EXIT_FATAL
from hpc_train.core.rundir import RunDir, read_json
from hpc_train.runtime.supervisor import CANCELLED

from ..conftest import assert_bitwise_equal, wait_for_ranks
from .conftest import cli, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

JOB = [
    "cluster=slurm",
    "cluster.nodes=1",
    "cluster.tasks_per_node=1",
    "cluster.slurm.mem=1G",  # (a job without --mem gets all of a testbed node's memory: one job per node)
    "cluster.status_every_s=1",  # wait_for_ranks acts on the steps the statuses say
    "data.num_samples=2048",
    "model.hidden_sizes=[512,512]",
    "model.dropout=0.1",
    "trainer.max_steps=60",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=1",
    "trainer.plots=false",
    "trainer.tensorboard=false",
    "trainer.progress_bar=false",
]
LRS = "trainer.lr=1e-3,2e-3,3e-3,4e-3"


def sweep(sweep_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Submit ``-m JOB ARGS`` into ``sweep_dir``; the launcher's stdout."""
    proc = cli("hpc_train", "-m", *JOB, *args, f"hydra.sweep.dir={sweep_dir}", cwd=sweep_dir.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def job_of(run_dir: Path) -> dict:  # type: ignore[type-arg]
    record = read_json(RunDir(run_dir).job_record)
    assert isinstance(record, dict)
    return record


def sacct(*args: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-n", "-P", *args], capture_output=True, text=True, timeout=30, check=True)
    return [line.split("|") for line in out.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four points of LRS unpacked (one job each), submitted at once; each test waits for what it reads."""
    sweep_dir = tmp_path_factory.mktemp("twins") / "sweep"
    sweep_dir.parent.mkdir(exist_ok=True)
    sweep(sweep_dir, LRS)
    return sweep_dir


def test_four_points_in_two_packs_run_side_by_side_and_train_as_unpacked(tmp_path: Path, twins: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    out = sweep(sweep_dir, LRS, "cluster.pack=2", "cluster.slurm.submit=sbatch")
    array_id = re.search(r"submitted 4 runs in 2 pack\(s\) of up to 2, as Slurm job array (\d+)", out)
    assert array_id is not None, out
    script = (sweep_dir / "slurm" / "job.sbatch").read_text()
    assert "#SBATCH --array=0-1" in script and "#SBATCH --ntasks-per-node=2" in script, script
    assert "#SBATCH --mem=2048M" in script, script  # two members of 1G
    records = [job_of(sweep_dir / str(i)) for i in range(4)]
    assert [r["job_id"] for r in records] == [f"{array_id[1]}_{i // 2}" for i in range(4)]
    assert [r["pack"]["index"] for r in records] == [0, 1, 0, 1]
    assert records[2]["pack"]["members"] == [str(sweep_dir / "2"), str(sweep_dir / "3")]
    assert wait_for_job(array_id[1], timeout=400) == "COMPLETED"

    for element in ("0", "1"):
        # Both members' training steps ran at the same time (Slurm's own record of the steps).
        deadline = time.monotonic() + 30  # accounting trails the end by a moment
        while True:
            steps = [r for r in sacct("-j", f"{array_id[1]}_{element}", "-o", "JobID,Start,End") if "." in r[0]]
            steps = [r for r in steps if r[0].split(".")[-1].isdigit()]
            if (len(steps) == 2 and all(r[2] not in ("Unknown", "") for r in steps)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(steps) == 2, steps
        assert max(r[1] for r in steps) < min(r[2] for r in steps), f"the members' steps did not overlap: {steps}"
    # Each member's step: only its CPUs (--exact) and its half of the job's memory.
    output = (sweep_dir / "slurm" / f"slurm-{array_id[1]}_0.out").read_text()
    assert "--exact --job-name=member1 --mem=1024M" in output, output[-3000:]
    for i in range(4):
        table = json.loads((sweep_dir / str(i) / "rank_table.json").read_text())
        assert len(table) == 1
        records[i]["master"] = table[0]["master"]
    # Each member its own MASTER_PORT (from its step id), as an unpacked run its own.
    assert records[0]["master"] != records[1]["master"] and records[2]["master"] != records[3]["master"]
    for i in range(4):
        assert wait_for_job(job_of(twins / str(i))["job_id"], timeout=300) == "COMPLETED"
        assert_bitwise_equal(sweep_dir / str(i), twins / str(i))
    collect = cli("hpc_train.jobs", "collect", str(sweep_dir), cwd=tmp_path)
    rows = collect.stdout.splitlines()[1:]
    assert [row.split()[2:4] for row in rows] == [[f"{array_id[1]}_{i // 2}", "COMPLETED"] for i in range(4)], rows
    status = cli("hpc_train.jobs", "status", str(sweep_dir / "1"), cwd=tmp_path).stdout
    assert f"pack member 1 of 2 in job {array_id[1]}_0; every rank completed" in status, status
    where = cli("hpc_train.jobs", "status", str(sweep_dir), cwd=tmp_path).stdout
    assert f"pack in job {array_id[1]}_1 (2 members, 1 allocation(s)): held " in where, where


@pytest.mark.generations
def test_a_preempted_pack_is_requeued_once_and_its_members_resume_exactly(tmp_path: Path) -> None:
    """Four members in one job (submitit): the two of 10 steps finish; then USR2 reaches one of the two of 1000
    steps (its step alone, as Slurm names it: member2), which stops and asks for a requeue; the pack passes the
    stop on to the other, which stops too; each is at its own checkpoint, and the job is requeued once. In the
    next allocation the finished members are skipped and the others resume, ending on their unpacked twins'
    weights. (USR2 to the whole job reaches every member's ranks at once, as the time limit's does.)"""
    twins = tmp_path / "twins"
    twins.mkdir()
    sweep(twins / "sweep", "trainer.max_steps=1000", "trainer.lr=1e-3,2e-3")  # beside the pack, on the other node
    sweep_dir = tmp_path / "sweep"
    out = sweep(sweep_dir, "trainer.max_steps=10,1000", "trainer.lr=1e-3,2e-3", "cluster.pack=4")
    assert "in 1 pack(s) of up to 4, as Slurm job " in out, out
    members = [sweep_dir / str(i) for i in range(4)]  # (10, 1e-3), (10, 2e-3), (1000, 1e-3), (1000, 2e-3)
    job_id = job_of(members[0])["job_id"]
    assert "_" not in job_id and {job_of(m)["job_id"] for m in members} == {job_id}
    deadline = time.monotonic() + 300
    while not all(RunDir(m).read_statuses().get(0, {}).get("state") == "completed" for m in members[:2]):
        assert time.monotonic() < deadline, "the short members did not complete"
        time.sleep(0.05)
    for member in members[2:]:
        wait_for_ranks(member, 20, timeout=300)
    steps = subprocess.run(
        ["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split("\n")
    step = next(line.split()[0] for line in steps if line.endswith(" member2"))
    subprocess.run(["scancel", "--signal=USR2", step], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=400) == "COMPLETED"

    for member in members[:2]:  # finished before the stop: one attempt, in the first allocation
        assert [a.requeue for a in RunDir(member).attempt_records()] == [0]
    for member in members[2:]:
        rd = RunDir(member)
        assert len(rd.requeue_records()) == 1, rd.requeue_records()
        assert "resumed from" in (member / "logs" / "rank_0.restart1.log").read_text()
    out = Path(job_of(members[0])["slurm_output"])  # submitit's: the supervisor's lines are in its .err
    output = out.read_text() + (out.with_suffix(".err").read_text() if out.with_suffix(".err").exists() else "")
    assert output.count(") has ended (completed); skipped") == 2, output[-3000:]
    assert "a member stopped to be requeued; passing SIGUSR2 on to the members left" in output, output[-3000:]
    # One requeue for the pack: Slurm holds two records of the job, the first ended by the requeue.
    deadline = time.monotonic() + 30
    while (states := [r[1] for r in sacct("-D", "-X", "-j", job_id, "-o", "JobID,State")]) != [
        "REQUEUED",
        "COMPLETED",
    ] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert states == ["REQUEUED", "COMPLETED"], states
    for i in (0, 1):
        twin = twins / "sweep" / str(i)
        assert wait_for_job(job_of(twin)["job_id"], timeout=300) == "COMPLETED"
        assert_bitwise_equal(members[2 + i], twin)


def test_a_member_that_fails_ends_alone(tmp_path: Path, twins: Path) -> None:
    """Member 0 raises at step 15 in every attempt: it is restarted in the allocation once, then ended as a fatal
    failure (the same exception from the same step twice). Member 1 trains on beside it to its twin's weights."""
    sweep_dir = tmp_path / "sweep"
    fault = {"HPC_TRAIN_FAULT": "member=0,rank=0,step=15,kind=raise"}
    sweep(sweep_dir, "trainer.lr=3e-3,4e-3", "cluster.pack=2", env=fault)
    failing, neighbour = RunDir(sweep_dir / "0"), RunDir(sweep_dir / "1")
    job_id = job_of(failing.path)["job_id"]
    assert wait_for_job(job_id, timeout=400) == "FAILED"  # the pack's status is its failed member's
    assert [str(a.outcome) for a in failing.attempt_records()] == ["failed", "fatal"]
    assert [str(a.outcome) for a in neighbour.attempt_records()] == ["completed"]
    assert (
        read_json(failing.batch_exit)["exit_code"] == EXIT_FATAL and read_json(neighbour.batch_exit)["exit_code"] == 0
    )
    assert wait_for_job(job_of(twins / "3")["job_id"], timeout=300) == "COMPLETED"
    assert_bitwise_equal(neighbour.path, twins / "3")
    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(failing.path), cwd=tmp_path).stdout)[0]
    assert not status["ok"] and "fatal failure" in status["detail"], status


@pytest.mark.generations
def test_each_member_sees_only_its_own_gpu(tmp_path: Path) -> None:
    """The gpu partition's node has 2 fake GPUs (GRES): a pack of two 1-GPU members gets one each."""
    sweep_dir = tmp_path / "sweep"
    gpus = ["cluster.slurm.partition=gpu", "cluster.gpus_per_node=1", "trainer.max_steps=5", "cluster.pack=2"]
    sweep(sweep_dir, "trainer.lr=1e-3,2e-3", *gpus)
    assert "#SBATCH --gpus-per-node=2" in (sweep_dir / "slurm" / "job.sbatch").read_text()
    assert wait_for_job(job_of(sweep_dir / "0")["job_id"], timeout=300) == "COMPLETED"
    seen = [json.loads((sweep_dir / str(i) / "rank_table.json").read_text())[0] for i in (0, 1)]
    assert sorted(r["cuda_visible_devices"] for r in seen) == ["0", "1"], seen


def test_one_member_is_cancelled_alone(tmp_path: Path) -> None:
    """`jobs cancel` of one member: its supervisor stops its step (the ranks checkpoint on the stop signal,
    and do not ask for a requeue) and starts no other; its neighbour trains on to the end; the job completes
    and is not requeued."""
    sweep_dir = tmp_path / "sweep"
    sweep(sweep_dir, "trainer.max_steps=1500", "trainer.lr=1e-3,2e-3", "cluster.pack=2")
    cancelled, neighbour = RunDir(sweep_dir / "0"), RunDir(sweep_dir / "1")
    wait_for_ranks(cancelled.path, 20, timeout=300)
    proc = cli("hpc_train.jobs", "cancel", str(cancelled.path), cwd=tmp_path)
    assert proc.returncode == 0 and f"cancel requested for {cancelled.path}" in proc.stdout, proc.stdout + proc.stderr
    assert wait_for_job(job_of(cancelled.path)["job_id"], timeout=400) == "COMPLETED"
    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(sweep_dir), cwd=tmp_path).stdout)
    assert [s["state"] for s in status] == ["CANCELLED", "COMPLETED"], status
    stopped = cancelled.read_statuses()[0]
    assert stopped["state"] == "stopped" and 20 <= stopped["step"] < 1500 and cancelled.checkpoint_files()
    assert [(str(a.outcome), a.message) for a in cancelled.attempt_records()] == [("stopped", CANCELLED)]
    assert (
        cancelled.path / "checkpoints" / f"step_{stopped['step']:09d}.pt"
    ).is_file() and not cancelled.requeue_records()
    assert neighbour.read_statuses()[0]["step"] == 1500 and (neighbour.path / "model_final.pt").is_file()
