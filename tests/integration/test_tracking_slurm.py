"""Trackers on the real testbed: a real MLflow tracking server (SQLite backend) on the controller's address, W&B
offline files; a job preempted with USR2 (requeued), then restarted in its allocation after a rank dies, is
one MLflow run and one W&B run with every logged step once. Its timeline is drawn (the README's picture)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir

from ..conftest import REPO, needs, wait_for_step
from ..wandb_offline import attempts_that_opened_wandb, offline_history
from .conftest import SLURM_2X1, cli, submit_job, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed"), needs("mlflow", "wandb")]

CONTROLLER = "10.77.0.1"
"""The testbed controller's address, which every node (a network namespace on the bridge) reaches."""

# Rows every 5 steps, a checkpoint every 10. The first attempt is stopped by USR2 once it is past step 12; the
# requeued one loses rank 1 at step 37 (its fault is armed in attempt 1 only), after logging row 35, and the
# supervisor restarts it in the same allocation from the checkpoint of step 30: steps 31..37 are trained again.
JOB = [
    *SLURM_2X1,
    "model.hidden_sizes=[512,512]",
    "trainer.max_steps=60",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=5",
    "trainer.checkpoint_every_n_steps=10",
    "trainer.val_every_n_steps=20",
    "trainer.plots=false",
    "trainer.progress_bar=false",
]


def steps(run_dir: Path) -> list[int]:
    """The steps of rank 0's metrics rows so far: written as they come, unlike the ranks' statuses, which reach
    the run dir every cluster.status_every_s (the stop must land between the rows of steps 12 and 30)."""
    rows = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    return [json.loads(row)["step"] for row in rows if row.strip().endswith("}")]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` with a SQLite store, listening on the controller's address; its URI."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port(CONTROLLER)
    argv = [
        *[sys.executable, "-m", "mlflow", "server", "--host", CONTROLLER, "--port", str(port), "--workers", "1"],
        *["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--default-artifact-root", str(root / "artifacts")],
    ]
    log = (root / "server.log").open("w")
    # Without MLflow's job runner: its huey consumers cost ~60 CPU-s of the testbed's 2 cores, for nothing here.
    environ = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=environ)
    uri = f"http://{CONTROLLER}:{port}"
    deadline = time.monotonic() + 120  # mostly imports: 10-30 s on a loaded machine
    try:
        while True:
            assert server.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server not ready in 120 s: " + (root / "server.log").read_text()
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        log.close()


def test_a_preempted_and_restarted_job_is_one_run_with_every_step_once(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    trackers = [
        f"tracking.mlflow.uri={mlflow_server}",
        "tracking.mlflow.experiment=slurm-test",
        "tracking.wandb.project=slurm-test",
        "tracking.wandb.mode=offline",
    ]
    fault = {"HPC_TRAIN_FAULT": "rank=1,step=37,kind=exit,attempt=1"}
    job_id = submit_job(run_dir, *JOB, *trackers, env=fault)
    deadline = time.monotonic() + 240
    while max(steps(run_dir), default=0) < 12:
        assert time.monotonic() < deadline, "no step 12 within 240 s"
        time.sleep(0.1)
    # W&B's first run of an attempt takes seconds on the testbed's busy cores: give it until step 22 (the stop
    # must come before the checkpoint at 30) to start, so that the W&B run is normally resumed across folders.
    deadline = time.monotonic() + 240
    while not attempts_that_opened_wandb(run_dir) and max(steps(run_dir), default=0) < 22:
        assert time.monotonic() < deadline, f"neither W&B nor step 22 within 240 s: {steps(run_dir)}"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR2", "--full", job_id], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=600) == "COMPLETED"

    rd = RunDir(run_dir)
    outcomes = [(a.attempt, str(a.outcome)) for a in rd.attempt_records()]
    assert outcomes == [(0, "stopped"), (1, "failed"), (2, "completed")], outcomes
    rows = {r["step"]: r for r in map(json.loads, rd.metrics.read_text().splitlines())}
    assert set(range(5, 61, 5)) <= set(rows)  # (and the ends of epochs, which validate)
    runs = {r.tracker: r for r in rd.tracker_runs()}
    assert {name: r.logged_step for name, r in runs.items()} == {"mlflow": 60, "wandb": 60}

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("slurm-test")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [runs["mlflow"].run_id]
    found = client.get_run(runs["mlflow"].run_id)
    assert found.info.status == "FINISHED"
    notes = {k: v for k, v in found.data.tags.items() if k.startswith("hpc_train.attempt.")}
    assert sorted(notes) == ["hpc_train.attempt.0", "hpc_train.attempt.1", "hpc_train.attempt.2"], notes
    assert "resumed from step 30 after attempt 1 failed (" in notes["hpc_train.attempt.2"], notes
    history = client.get_metric_history(runs["mlflow"].run_id, "train_loss")
    assert sorted(m.step for m in history) == sorted(rows)  # every row once: 35 was not logged again
    assert {m.step: m.value for m in history} == pytest.approx({s: r["train_loss"] for s, r in rows.items()})

    offline = offline_history(run_dir, runs["wandb"].run_id)
    # An offline folder per attempt that started W&B (tests/wandb_offline.py says why not every attempt does),
    # all of the one run; an attempt that ends inside wandb.init can leave a folder and no "logging to" line.
    folders = list((run_dir / "wandb").glob("offline-run-*"))
    assert 1 <= len(attempts_that_opened_wandb(run_dir)) <= len(folders) <= 3, folders
    assert all(f.name.endswith("-" + runs["wandb"].run_id) for f in folders), folders
    # The killed attempt's rows never reached its file (W&B's service writes them): the attempt after it sent
    # them again from metrics.jsonl, up to its checkpoint. Every step once, in order.
    assert [step for _, step, _ in offline] == sorted(rows)

    # Where the time went: two allocations (the requeue), three attempts, drawn and summed up in jobs status.
    drawn = cli("hpc_train.plot", str(run_dir), "--timeline", cwd=tmp_path)
    assert drawn.returncode == 0 and drawn.stdout.strip() == str(run_dir / "plots" / "timeline.png"), drawn.stderr
    status = cli("hpc_train.jobs", "status", str(run_dir), cwd=tmp_path).stdout
    assert f"{run_dir}: 2 allocation(s), 3 attempt(s): waiting in the queue " in status, status


def test_a_hugging_face_script_preempted_and_restarted_is_one_run_with_every_step_once(
    tmp_path: Path, mlflow_server: str
) -> None:
    """A Hugging Face Trainer script with ``report_to=["mlflow", "wandb"]`` and the PreemptionCallback, on the
    testbed against the real MLflow server: stopped by USR2 past step 12 (requeued), then its requeued attempt
    raises at step 37 after reporting step 35 and is restarted in the allocation from checkpoint-30. MLflow and
    W&B each hold one run with every reported step once: 35, trained twice, is reported once. (One node, one
    rank: the reporting is rank 0's, and each rank's import of transformers costs the testbed's cores ~8 s.)"""
    pytest.importorskip("transformers", reason="the Hugging Face Trainer is in the test extra")
    from mlflow.tracking import MlflowClient

    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    args = f"[--out,{out},--steps,50,--sleep,0.1,--report-to,'mlflow,wandb',--logging-steps,5,--save-steps,10"
    args += ",--fail-at,37]"
    job = [
        *["cluster=slurm", "cluster.nodes=1", "cluster.tasks_per_node=1"],
        f"script.path={REPO / 'hpc_train' / 'examples' / 'hf_trainer.py'}",
        f"script.args={args}",
        f"tracking.mlflow.uri={mlflow_server}",
        "tracking.mlflow.experiment=slurm-hf",
        "tracking.wandb.project=slurm-hf",
        "tracking.wandb.mode=offline",
    ]
    job_id = submit_job(run_dir, *job)
    at = wait_for_step(out, 1, 12, timeout=300)
    subprocess.run(["scancel", "--signal=USR2", "--full", job_id], check=True, timeout=30)
    assert wait_for_job(job_id, timeout=600) == "COMPLETED"

    rd = RunDir(run_dir)
    outcomes = [(a.attempt, str(a.outcome)) for a in rd.attempt_records()]
    assert outcomes == [(0, "stopped"), (1, "failed"), (2, "completed")], outcomes
    starts = [int(s) for s in (out / "starts.txt").read_text().split()]
    assert len(starts) == 3 and starts[0] == 0 and at <= starts[1] < 30 and starts[2] == 30, (at, starts)

    runs = {r.tracker: r for r in rd.tracker_runs()}
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("slurm-hf")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [runs["mlflow"].run_id]
    steps = sorted(m.step for m in client.get_metric_history(runs["mlflow"].run_id, "loss"))
    assert steps == list(range(5, 51, 5)), steps  # each once, none missing: 35 once though trained twice

    rows = [values for _, _, values in offline_history(run_dir, runs["wandb"].run_id) if "train/loss" in values]
    assert [r["train/global_step"] for r in rows] == list(range(5, 51, 5))
