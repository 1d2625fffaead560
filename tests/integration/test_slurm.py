"""cluster=slurm against a real Slurm with two nodes (the testbed): submission, scripts, arrays, status."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir, read_json
from hpc_train.core.state import child_pids

from .conftest import SLURM_2X1, SLURM_2X2, cli, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]

TWO_BY_TWO = [*SLURM_2X2, "model.hidden_sizes=[64]"]
TWO_BY_ONE = [*SLURM_2X1, "model.hidden_sizes=[64]"]
"""For the tests whose point is not two ranks a node (what the launcher, the jobs command or the API does with a
job, an array): each rank is a process that imports torch (~4 CPU-s here). Two ranks a node are submitted every
way by the other tests here (submitit, plain sbatch, salloc, a torchrun-style script) and in arrays by
test_pack_slurm."""


def assert_trained_on_two_hosts(run_dir: Path, ranks: int = 4) -> None:
    table = json.loads((run_dir / "rank_table.json").read_text())
    assert [row["rank"] for row in table] == list(range(ranks))
    assert len({row["host"] for row in table}) == 2, table
    assert len({row["master"] for row in table}) == 1, "ranks disagree on MASTER_ADDR:PORT"
    assert {row["source"] for row in table} == {"slurm"}
    assert (run_dir / "model_final.pt").is_file()


@pytest.mark.generations
def test_submitit_two_nodes_by_two_tasks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = cli(
        "hpc_train", *TWO_BY_TWO, "cluster.wait=true", "trainer.max_steps=20", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"submitted Slurm job \d+", proc.stdout)
    assert_trained_on_two_hosts(run_dir)
    status = cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path)
    assert json.loads(status.stdout)[0]["state"] == "COMPLETED"


def ten_steps(
    tmp_path: Path, *extra: str, shape: list[str] = TWO_BY_TWO
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``python -m hpc_train`` of a 10-step job (2 x 2 unless ``shape`` says) in tmp_path/run, with ``extra``
    overrides."""
    run_dir = tmp_path / "run"
    proc = cli("hpc_train", *shape, *extra, "trainer.max_steps=10", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    return proc, run_dir


def test_returns_at_once_without_wait(tmp_path: Path) -> None:
    proc, run_dir = ten_steps(tmp_path, "cluster.submit=sbatch", shape=TWO_BY_ONE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = read_json(RunDir(run_dir).job_record)["job_id"]
    assert f"python -m hpc_train.jobs logs {run_dir} --follow" in proc.stdout
    follow = cli("hpc_train.jobs", "logs", str(run_dir), "--follow", "--timeout", "180", cwd=tmp_path)
    assert follow.returncode == 0, follow.stderr[-2000:]
    assert "saved" in follow.stdout and f"job {job_id} completed" in follow.stdout
    assert_trained_on_two_hosts(run_dir, ranks=2)


def trivial_container(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper command like `apptainer exec img.sif`: it logs where and what it runs, then runs it."""
    wrapper, log = tmp_path / "wrap dir" / "wrap.sh", tmp_path / "wrapped.log"
    wrapper.parent.mkdir()
    script = f'#!/bin/bash\n[ "$1" = --flag ] && shift\necho "$(hostname) $*" >> {shlex.quote(str(log))}\nexec "$@"\n'
    wrapper.write_text(script)
    wrapper.chmod(0o755)
    return wrapper, log


@pytest.mark.generations
def test_generated_script_with_plain_sbatch(tmp_path: Path) -> None:
    """The script of a dry run, submitted by hand; cluster.container wraps the batch step and every rank."""
    wrapper, wrapped = trivial_container(tmp_path)
    # A wrapper path with a space, quoted for the shell split, and a flag: 'wrap dir/wrap.sh' --flag.
    dry, run_dir = ten_steps(tmp_path, "cluster.dry_run=true", f"cluster.container=\"'{wrapper}' --flag\"")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "nothing submitted" in dry.stdout and "CUDA_VISIBLE_DEVICES" in dry.stdout
    checked = "dry run checked the request against the cluster's partitions and limits (asked Slurm just now)"
    assert f"{checked} and by Slurm itself (sbatch --test-only)" in dry.stdout, dry.stdout[-1000:]
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20).stdout.split()[-1]
    rule = {"22.05": "keeps the job's submit time (before", "24.11": "resets the job's submit time (from"}
    assert f" Slurm {version}: a requeue {rule[version[:5]]}" in dry.stdout, dry.stdout[-1000:]
    assert not (run_dir / "job.json").exists()
    script = run_dir / "job.sbatch"
    job_id = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.strip()
    assert wait_for_job(job_id) == "COMPLETED"
    assert_trained_on_two_hosts(run_dir)
    assert json.loads((run_dir / "status" / "batch_exit.json").read_text())["exit_code"] == 0
    lines = wrapped.read_text().splitlines()
    assert sum("-m hpc_train.supervisor" in line for line in lines) == 1, lines
    workers = [line.split()[0] for line in lines if "-m hpc_train.worker" in line]
    assert sorted(workers) == ["node1", "node1", "node2", "node2"], lines


@pytest.mark.generations
def test_training_in_an_salloc_allocation(tmp_path: Path) -> None:
    """Inside `salloc -N2` (no step yet), cluster.submit=here trains on the allocation's nodes with srun: no new
    job, the same supervisor, and the container wrapper on every rank."""
    wrapper, wrapped = trivial_container(tmp_path)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", *TWO_BY_TWO, "cluster.submit=here", "trainer.max_steps=10"]
    argv += [f"cluster.container=\"'{wrapper}'\"", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        ["salloc", "-N2", "--ntasks-per-node=2", "--time=5", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"training in allocation \d+ on node1,node2 \(cluster\.slurm\.submit=here", proc.stdout), (
        proc.stdout
    )
    assert_trained_on_two_hosts(run_dir)
    assert not (run_dir / "job.json").exists()  # no job was submitted
    assert sorted(line.split()[0] for line in wrapped.read_text().splitlines()) == ["node1", "node1", "node2", "node2"]
    status = cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path)
    assert json.loads(status.stdout)[0]["state"] == "COMPLETED", status.stdout


@pytest.mark.generations
def test_sweep_is_one_array(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    # Two nodes an element, one rank a node: test_pack_slurm submits arrays of two ranks a node.
    args = ["-m", *TWO_BY_ONE, "trainer.max_steps=10", "trainer.lr=1e-3,3e-3,1e-2", "cluster.array_parallelism=2"]
    start = time.monotonic()
    proc = cli("hpc_train", *args, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - start < 30, "the sweep command waited for its jobs"
    array_id = re.search(r"Slurm job array (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    squeue = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%F", "-j", array_id], capture_output=True, text=True
    ).stdout.split()
    assert set(squeue) <= {array_id}
    assert "--array=0-2%2" in (sweep_dir / "slurm" / "job.sbatch").read_text()
    wait_for_job(array_id)
    # Accounting trails squeue by a moment (slurmdbd hears of the end after slurmctld): poll it, bounded.
    expected = [f"{array_id}_{i}|COMPLETED" for i in range(3)]
    deadline = time.monotonic() + 30
    while True:
        sacct = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", array_id, "-o", "JobID,State"], capture_output=True, text=True
        ).stdout
        if sorted(sacct.split()) == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(sacct.split()) == expected
    collect = cli("hpc_train.jobs", "collect", str(sweep_dir), cwd=tmp_path)
    rows = collect.stdout.splitlines()[1:]
    assert [row.split()[1:4] for row in rows] == [
        [f"trainer.lr={lr}", f"{array_id}_{i}", "COMPLETED"] for i, lr in enumerate(["0.001", "0.003", "0.01"])
    ]
    for i in range(3):
        assert_trained_on_two_hosts(sweep_dir / str(i), ranks=2)


def test_hostile_names_are_inert(tmp_path: Path) -> None:
    """A job name, a run-dir path and a user-quoted setup value full of shell syntax: submitted for real,
    nothing runs; setup lines are shell, so $HOME expands and && chains on the compute node."""
    hostile = "a$(touch x);`touch x`'q\"d"
    conf = tmp_path / "conf" / "cluster"
    conf.mkdir(parents=True)
    # JSON is YAML: the values reach the config exactly as written here.
    values = {
        "launcher": "slurm",
        "submit": "sbatch",
        "wait": True,
        "nodes": 2,
        "tasks_per_node": 1,
        "job_name": hostile,
        "setup": [f"echo {shlex.quote(hostile)}", 'cd "$HOME" && echo "setup ran in $(pwd) as $USER"'],
    }
    (conf / "hostile.yaml").write_text(json.dumps(values))
    run_dir = tmp_path / f"run {hostile}"
    quoted_dir = "'" + str(run_dir).replace("'", "\\'") + "'"
    args = ["--config-dir", str(tmp_path / "conf"), "cluster=hostile", *TWO_BY_ONE[3:], "trainer.max_steps=5"]
    proc = cli("hpc_train", *args, f"hydra.run.dir={quoted_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    job_id = read_json(RunDir(run_dir).job_record)["job_id"]
    # scontrol, not sacct: slurmdbd stores '"' in job names as '`'.
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    assert shown.splitlines()[0].split(" JobName=", 1)[1] == hostile
    output = Path(read_json(RunDir(run_dir).job_record)["slurm_output"]).read_text()
    assert hostile in output
    home = os.path.expanduser("~")
    assert f"setup ran in {home} as " in output  # $HOME, && and $(pwd) worked: the line ran as shell
    assert not list(tmp_path.rglob("x")), "a hostile value was executed"
    assert_trained_on_two_hosts(run_dir, ranks=2)


@pytest.mark.parametrize("dry_run", [False, True])
def test_unknown_partition_is_refused_before_submission(tmp_path: Path, dry_run: bool) -> None:
    """Checked against the live cluster, a dry run too: one clean line naming the key and the partitions."""
    proc = cli(
        "hpc_train",
        *TWO_BY_TWO,
        "cluster.partition=nosuchpartition",
        f"cluster.dry_run={str(dry_run).lower()}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "cluster.slurm.partition='nosuchpartition' cannot run: there is no partition" in proc.stderr, proc.stderr[
        -2000:
    ]
    assert "HINT: pick one of: " in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "job.json").exists()


@pytest.mark.generations
def test_test_only_refusal_names_the_key(tmp_path: Path) -> None:
    """A request only Slurm can judge (a node feature no node has) is refused by sbatch --test-only: Slurm's
    words plus the key to change, without a traceback, and nothing queued."""
    run_dir = tmp_path / "run"
    proc = cli("hpc_train", *TWO_BY_TWO, "cluster.constraint=nosuchfeature", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 1
    assert "nothing was submitted: Slurm refused the request (sbatch --test-only" in proc.stderr, proc.stderr[-2000:]
    assert "HINT: change cluster.slurm.constraint" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run_dir / "job.json").exists()


def _rank_pid(run_dir: Path, rank: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = RunDir(run_dir).read_statuses().get(rank, {})
        if status.get("state") == "running" and status.get("step", 0) >= 1:
            return int(status["pid"])
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reported a step")


@pytest.mark.generations
def test_status_without_slurmdbd_and_after_sigkill(tmp_path: Path) -> None:
    testbed = Path(__file__).resolve().parents[2] / "slurm" / "testbed.sh"
    subprocess.run([str(testbed), "stop-dbd"], check=True, timeout=60)
    try:
        assert subprocess.run(["sacct", "-n", "-X"], capture_output=True, timeout=30).returncode != 0, (
            "sacct still works"
        )
        run_dir = tmp_path / "run"
        slow = [
            "trainer.max_steps=100000",
            "trainer.max_epochs=0",
            "trainer.log_every_n_steps=1",
            "cluster.submit=sbatch",
            "cluster.max_failures=0",  # no restart in the allocation: the failure ends the job
        ]
        proc = cli("hpc_train", *TWO_BY_ONE, *slow, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        pid = _rank_pid(run_dir, 1)
        running = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path).stdout)[0]
        assert running["state"] == "RUNNING" and running["sacct"] is None
        start = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # the testbed's nodes share this machine's pid namespace
        job_id = read_json(RunDir(run_dir).job_record)["job_id"]
        final = wait_for_job(job_id, timeout=90)
        ended_after = time.monotonic() - start
        status = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path).stdout)[0]
        assert final in ("FAILED", "CANCELLED")
        assert status["state"] in ("FAILED", "CANCELLED") and status["done"] and not status["ok"]
        assert "rank 1 on node2 stopped reporting" in status["detail"], status
        assert ended_after < 60, f"a SIGKILLed rank took {ended_after:.0f}s to end the job"
    finally:
        subprocess.run([str(testbed), "start-dbd"], check=True, timeout=60)


@pytest.mark.generations
def test_real_slurm_variables_resolve(tmp_path: Path) -> None:
    """Uneven layout (3 tasks on 2 nodes) and the outside-a-step error, on real SLURM_* variables."""
    probe = (
        "import json; from hpc_train.distributed import resolve_environment as r; e = r(); "
        "print(json.dumps([e.rank, e.local_rank, e.local_world_size, e.node_rank, e.num_nodes, e.hostname, e.master_addr, e.master_port]))"
    )
    script = tmp_path / "probe.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks=3\n#SBATCH --output=" + str(tmp_path / "out-%j.txt") + "\n"
        f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)} || echo OUTSIDE-STEP-REFUSED\n"
        f"srun --kill-on-bad-exit=1 {shlex.quote(sys.executable)} -c {shlex.quote(probe)}\n"
    )
    job_id = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.strip()
    assert wait_for_job(job_id) == "COMPLETED"
    out = (tmp_path / f"out-{job_id}.txt").read_text()
    assert "OUTSIDE-STEP-REFUSED" in out and "HINT: launch every task with srun" in out
    rows = sorted(json.loads(line) for line in out.splitlines() if line.startswith("["))
    assert [r[:5] for r in rows] == [[0, 0, 2, 0, 2], [1, 1, 2, 0, 2], [2, 0, 1, 1, 2]]
    assert [r[5] for r in rows] == ["node1", "node1", "node2"]
    assert len({(r[6], r[7]) for r in rows}) == 1 and rows[0][6] == "node1"


def test_logs_and_cancel(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    slow = ["trainer.max_steps=100000", "trainer.max_epochs=0", "trainer.log_every_n_steps=5", "cluster.submit=sbatch"]
    proc = cli("hpc_train", *TWO_BY_ONE, *slow, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _rank_pid(run_dir, 1)
    rank1 = cli("hpc_train.jobs", "logs", str(run_dir), "--rank", "1", cwd=tmp_path)
    assert "[rank 1]" in rank1.stdout and "[rank 0]" not in rank1.stdout
    job_id = read_json(RunDir(run_dir).job_record)["job_id"]
    cancel = cli("hpc_train.jobs", "--search", str(tmp_path), "cancel", job_id, cwd=tmp_path)
    assert cancel.returncode == 0 and f"cancelled Slurm job(s) {job_id}" in cancel.stdout
    assert wait_for_job(job_id, timeout=60) == "CANCELLED"
    status = json.loads(cli("hpc_train.jobs", "status", "--json", str(run_dir), cwd=tmp_path).stdout)[0]
    assert (status["state"], status["done"], status["ok"]) == ("CANCELLED", True, False)
    slurm_out = cli("hpc_train.jobs", "logs", str(run_dir), "--slurm", cwd=tmp_path)
    assert "[rank 0] rank table (attempt 0, 2 ranks)" in slurm_out.stdout
    assert f"JOB {job_id} ON node1 CANCELLED" in slurm_out.stdout


def test_torchrun_style_script_on_two_nodes(tmp_path: Path) -> None:
    """hpc_train/examples/ddp_tutorial.py, unchanged, on 2 nodes x 2 tasks."""
    out = tmp_path / "out"
    out.mkdir()
    script = Path(__file__).resolve().parents[2] / "hpc_train" / "examples" / "ddp_tutorial.py"
    args = [*TWO_BY_TWO, "cluster.wait=true", f"script.path={script}", f"script.args=[--out,{out}]"]
    proc = cli("hpc_train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(s["rank"], s["local_rank"], s["world_size"]) for s in seen] == [(0, 0, 4), (1, 1, 4), (2, 0, 4), (3, 1, 4)]
    assert [s["env"]["GROUP_RANK"] for s in seen] == ["0", "0", "1", "1"]
    assert [s["host"] for s in seen] == ["node1", "node1", "node2", "node2"]
    assert {s["env"]["MASTER_ADDR"] for s in seen} == {"node1"}
    assert len({s["weight_sum"] for s in seen}) == 1, "DDP kept the ranks' weights in step"


def test_notebook_api_on_slurm(tmp_path: Path) -> None:
    from hpc_train.api import submit

    run = submit(*TWO_BY_ONE, "trainer.max_steps=10", run_dir=tmp_path / "run")
    result = run.result(timeout=180)
    assert result["state"] == "COMPLETED" and result["final"]["step"] == 10
    assert read_json(RunDir(tmp_path / "run").job_record)["job_id"]
    assert_trained_on_two_hosts(tmp_path / "run", ranks=2)


def test_ctrl_c_in_an_salloc_allocation_checkpoints(tmp_path: Path) -> None:
    """Ctrl-C to `hpc-train cluster.submit=here` (srun runs in its own process group, so only the launcher gets
    it): the ranks get cluster.signal through srun, checkpoint at one step, and the command says how to resume."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", *TWO_BY_ONE, "cluster.submit=here", "trainer.max_steps=100000"]
    argv += ["trainer.max_epochs=0", f"hydra.run.dir={run_dir}"]
    salloc = subprocess.Popen(
        ["salloc", "-N2", "--ntasks-per-node=1", "--time=5", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 120
    while not RunDir(run_dir).read_statuses().get(0, {}).get("step"):
        assert time.monotonic() < deadline and salloc.poll() is None, "the run never reported a step"
        time.sleep(0.5)

    (launcher,) = child_pids(salloc.pid)  # salloc runs the command as its one child
    os.kill(launcher, signal.SIGINT)
    _, err = salloc.communicate(timeout=120)
    assert salloc.returncode == 130, err[-3000:]
    statuses = RunDir(run_dir).read_statuses()
    steps = {s["step"] for s in statuses.values()}
    assert {s["state"] for s in statuses.values()} == {"stopped"} and len(steps) == 1, statuses
    assert (run_dir / "checkpoints" / f"step_{steps.pop():09d}.pt").is_file()
    assert "resume: python -m hpc_train" in err and "cluster.slurm.submit=here" in err


def test_sigterm_while_sbatch_answers_keeps_the_job_and_says_so(tmp_path: Path) -> None:
    """SIGTERM to the command after Slurm accepted the job but before the job was handed its run dir: the
    signal waits, the job gets its run dir and its record, and the command's last line names the job that goes
    on (not "nothing was launched")."""
    import shutil

    real = shutil.which("sbatch")
    assert real is not None
    accepted = tmp_path / "accepted"
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--test-only*) exec {real} "$@";; esac\n'
        f'out=$({real} "$@"); rc=$?\nprintf "%s" "$out" > {accepted}.new && mv {accepted}.new {accepted}\n'
        'printf "%s\\n" "$out"\nsleep 3\nexit $rc\n'
    )
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "hpc_train", *TWO_BY_ONE, "cluster.submit=sbatch", "trainer.max_steps=100000"]
    env = {**os.environ, "PATH": f"{wrapper.parent}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*argv, f"hydra.run.dir={run_dir}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not accepted.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    job_id = accepted.read_text().strip().split(";")[0]
    try:
        record = read_json(RunDir(run_dir).job_record)  # written although the signal came before it
        assert record and str(record["job_id"]) == job_id, (record, err[-2000:])
        assert proc.returncode == 130, err[-2000:]
        assert f"interrupted after Slurm accepted job {job_id}" in err and "nothing was launched" not in err, err
        assert json.loads((run_dir / "owner.json").read_text())["job_id"] == job_id
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=30)
    assert wait_for_job(job_id, timeout=120) == "CANCELLED"
