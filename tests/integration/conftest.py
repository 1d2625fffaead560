"""The real Slurm testbed (slurm/testbed.sh): started by scripts/test.sh, checked (and started if need be) here."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import TESTBED

# cluster.status_every_s=1: the tests act on steps they read from the ranks' statuses (wait_for_ranks); at the
# default 10 s a short test run could end before its statuses say the step it waits for.
FRESH = "cluster.status_every_s=1"
SLURM_2X2 = ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2", "data.num_samples=4096", FRESH]
SLURM_2X1 = ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "data.num_samples=4096", FRESH]
"""Two nodes, one rank each: still across nodes, at half the CPU of 2 x 2 on the testbed's 2 real cores (for
tests of a user's script, whose every rank imports its framework)."""
"""2 nodes x 2 ranks on the testbed's default partition, with data enough for several batches per rank."""


def _version() -> str:
    """What the Slurm on PATH says it is: ``24.11.5``, or '' without one."""
    try:
        said = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20, check=False)
    except OSError:
        return ""
    return said.stdout.split()[-1] if said.returncode == 0 and said.stdout.strip() else ""


def _nodes_idle() -> bool:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20, check=False)
    return proc.returncode == 0 and set(proc.stdout.split()) == {"idle"}


@pytest.fixture(scope="session")
def testbed() -> None:
    """Skip (saying why) where a testbed cannot exist; otherwise make sure it is up and idle."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root (it starts daemons and network namespaces)")
    generation = os.environ.get("HPC_TESTBED_SLURM", "22.05")
    if not _version().startswith(generation + ".") or shutil.which("slurmctld") is None:
        if shutil.which("apt-get") is None:
            pytest.skip(f"Slurm {generation} is not installed and apt-get is missing: cannot install the testbed")
        subprocess.run([str(TESTBED), "install"], check=True, timeout=900)
    if not _nodes_idle():
        subprocess.run([str(TESTBED), "start"], check=True, timeout=300)
    deadline = time.monotonic() + 60
    while not _nodes_idle():
        assert time.monotonic() < deadline, "testbed nodes did not become idle"
        time.sleep(0.5)


def wait_for_job(job_id: str, timeout: float = 180) -> str:
    """Poll until Slurm reports the job (or every array element) ended; returns the last state seen."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"], capture_output=True, text=True, timeout=20
        )
        states = set(proc.stdout.split())
        active = states & {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}
        if states and not active:
            return ",".join(sorted(states))
        assert time.monotonic() < deadline, f"job {job_id} still {states} after {timeout}s"
        time.sleep(0.5)


def cli(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` in ``cwd``, with ``env`` added to this process's environment."""
    import sys

    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=environ, timeout=timeout
    )


def submit_job(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``python -m hpc_train ARGS`` into ``run_dir`` (from its parent folder); the Slurm job id it recorded."""
    from hpc_train.core.rundir import RunDir, read_json

    proc = cli("hpc_train", *args, f"hydra.run.dir={run_dir}", cwd=run_dir.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(read_json(RunDir(run_dir).job_record)["job_id"])


class Baseline:
    """An uninterrupted job, submitted at once and waited for only when a test compares against it, so that it
    runs beside the job the test interrupts (a 2 x 2 job takes 2 of a debug node's 4 CPUs)."""

    def __init__(self, job_id: str, path: Path, timeout: float = 300) -> None:
        self.job_id, self._path, self._timeout, self._done = job_id, path, timeout, False

    def ready(self) -> Path:
        """The baseline's path (its run dir or a file it wrote), once its job has COMPLETED."""
        if not self._done:
            assert wait_for_job(self.job_id, timeout=self._timeout) == "COMPLETED"
            self._done = True
        return self._path
