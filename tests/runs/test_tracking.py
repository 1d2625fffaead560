"""Experiment trackers across attempts, with real stores: one MLflow run and one W&B run (offline files) per run
dir and every step once, after a crash that makes the resumed attempt train (and log) steps again, on another
shape (2 ranks, then 1); TensorBoard purges the redone steps."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir

from ..conftest import needs
from ..wandb_offline import attempts_that_opened_wandb, offline_history

pytestmark = needs("mlflow", "wandb")

# Rows every 5 steps, a checkpoint every 15: a failure at step 23 leaves rows 5..20 logged and the checkpoint
# of step 15, so the resumed attempt trains step 20 again (and must not log it twice). The trackers are rank
# 0's: one rank, unless a test resumes on another shape.
ONE_RANK = ["cluster.tasks_per_node=1"]
JOB = [
    "trainer.max_steps=30",
    "trainer.max_epochs=0",
    "data.num_samples=1400",
    "trainer.batch_size=32",
    "trainer.log_every_n_steps=5",
    "trainer.checkpoint_every_n_steps=15",
    "trainer.val_every_n_steps=10",
    "trainer.progress_bar=false",
    "trainer.plots=false",
]


def rows(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_a_failed_and_resumed_run_is_one_tracker_run_with_every_step_once(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"  # an absolute path: four slashes in all
    job = [
        *JOB,
        f"tracking.mlflow.uri={store}",
        "tracking.mlflow.experiment=resume-test",
        "tracking.wandb.project=resume-test",
        "tracking.wandb.mode=offline",
    ]
    # Failed on 2 ranks, resumed on 1 (accumulating 2 batches): the runs are the run dir's, whatever its shape.
    failed, run_dir = run_cli(*job, "cluster.tasks_per_node=2", env={"HPC_TRAIN_FAULT": "rank=0,step=23,kind=raise"})
    assert failed.returncode == 1, failed.stderr[-3000:]
    created = {r.tracker: r for r in RunDir(run_dir).tracker_runs()}
    assert set(created) == {"mlflow", "wandb"}
    # Up to the last row before the failure at 23, as far as the trackers took it: on busy cores their imports
    # alone can outlast the attempt, and then the next attempt sends every row (asserted below).
    assert {r.logged_step for r in created.values()} <= {None, 5, 10, 15, 20}, created
    # As an attempt leaves it whose W&B finish outlasted its end (seen on a loaded machine): rows in the offline
    # folder that logged_step does not count. The resumed attempt reads them there rather than send them twice.
    RunDir(run_dir).write_tracker_run(replace(created["wandb"], logged_step=None))

    resumed, _ = run_cli(*job, *ONE_RANK, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from 1 node x 2 tasks" in (run_dir / "logs" / "rank_0.restart1.log").read_text()
    runs = {r.tracker: r for r in RunDir(run_dir).tracker_runs()}
    assert {name: (r.run_id, r.logged_step) for name, r in runs.items()} == {
        name: (r.run_id, 30) for name, r in created.items()
    }
    run = runs["mlflow"]
    # The checkpoints say which runs hold their rows too (and the ledger keeps a copy: the next test).
    from hpc_train.train.checkpoint import load_checkpoint

    newest = max((run_dir / "checkpoints").glob("step_*.pt"))
    assert {t["tracker"]: t["run_id"] for t in load_checkpoint(newest)["trackers"]} == {
        name: r.run_id for name, r in runs.items()
    }

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("resume-test")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run.run_id]  # one run
    found = client.get_run(run.run_id)
    assert found.info.status == "FINISHED"
    assert found.data.tags["hpc_train.run_dir"] == str(run_dir.resolve())
    assert found.data.params["trainer.max_steps"] == "30" and found.data.params["tracking.mlflow.experiment"]
    assert "resumed from step 15 after" in found.data.tags["hpc_train.attempt.1"], found.data.tags
    expected = rows(run_dir)  # the resumed attempt's rows: step 20 trained again, to the same numbers
    assert {15, 20, 25, 30} <= set(expected)
    for key in ("train_loss", "val_loss", "lr"):
        history = client.get_metric_history(run.run_id, key)
        steps = [m.step for m in sorted(history, key=lambda m: m.step)]
        assert steps == [s for s in sorted(expected) if key in expected[s]], (key, steps)  # each step once
        assert {m.step: m.value for m in history} == pytest.approx({s: expected[s][key] for s in steps})

    # W&B, offline: a folder per attempt, under the run dir; the steps between them each once.
    history = offline_history(run_dir, runs["wandb"].run_id)
    folders = list((run_dir / "wandb").glob("offline-run-*"))
    # At most one per attempt, all of the one run; an attempt that ends inside wandb.init can leave a folder and
    # no "logging to W&B run" line.
    assert 1 <= len(attempts_that_opened_wandb(run_dir)) <= len(folders) <= 2, folders
    assert all(f.name.endswith("-" + runs["wandb"].run_id) for f in folders), folders
    assert [step for _, step, _ in history] == sorted(expected)
    assert [values["train_loss"] for _, _, values in history] == pytest.approx(
        [expected[s]["train_loss"] for s in sorted(expected)]
    )

    # TensorBoard: the failed attempt's events past the checkpoint are purged at the resumed writer's start.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / RunDir(run_dir).tensorboard_run.name))
    events.Reload()
    scalars = events.Scalars("train_loss")
    assert [e.step for e in scalars] == sorted(expected)
    assert [e.value for e in scalars] == pytest.approx([expected[s]["train_loss"] for s in sorted(expected)])


def test_a_script_gets_the_run_ids_the_trackers_read(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A user's script sees the run dir's runs as MLFLOW_RUN_ID and WANDB_RUN_ID (with the store, experiment,
    project, mode and resume=allow), the same on every attempt, and through hpc_train.preemption."""
    script = tmp_path / "show.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            from hpc_train import preemption
            names = ["MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "WANDB_PROJECT", "WANDB_RUN_ID",
                     "WANDB_RESUME", "WANDB_MODE", "WANDB_DIR"]
            seen = {n: os.environ.get(n) for n in names} | {"ids": preemption.tracker_run_ids()}
            with open(sys.argv[1] + "/seen_" + os.environ["RANK"] + "_" + str(preemption.restart_count()), "w") as f:
                json.dump(seen, f)
            """
        )
    )
    store = f"sqlite:///{tmp_path}/mlflow.db"
    job = [
        f"script.path={script}",
        f"script.args=[{tmp_path}]",
        f"tracking.mlflow.uri={store}",
        "tracking.wandb.project=demo",
        "tracking.wandb.mode=offline",
    ]
    for _ in range(2):  # a first launch and a relaunch of the run dir: the same ids
        proc, run_dir = run_cli(*job, run_dir=tmp_path / "run")
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.tracker: r for r in RunDir(run_dir).tracker_runs()}
    assert set(runs) == {"mlflow", "wandb"}
    expected = {
        "MLFLOW_TRACKING_URI": store,
        "MLFLOW_EXPERIMENT_NAME": "hpc_train",
        "MLFLOW_RUN_ID": runs["mlflow"].run_id,
        "WANDB_PROJECT": "demo",
        "WANDB_RUN_ID": runs["wandb"].run_id,
        "WANDB_RESUME": "allow",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(run_dir),
        "ids": {"mlflow": runs["mlflow"].run_id, "wandb": runs["wandb"].run_id},
    }
    for rank in (0, 1):
        for attempt in (0, 1):
            assert json.loads((tmp_path / f"seen_{rank}_{attempt}").read_text()) == expected, (rank, attempt)


def test_a_hugging_face_script_restarted_after_a_crash_logs_every_step_once(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """report_to=["mlflow", "wandb"] with no code of ours but the PreemptionCallback: the script fails at step 27
    on its first attempt, after logging steps 5..25; relaunched, it resumes from checkpoint-20 and trains 21..27
    again. MLflow and W&B hold each step once: the callback muted the reporting callbacks for step 25. (One
    rank: the reporting is rank 0's.)"""
    pytest.importorskip("transformers", reason="the Hugging Face Trainer is in the test extra")
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "hf_out"
    args = (
        f"[--out,{out},--steps,40,--sleep,0,--report-to,'mlflow,wandb',--logging-steps,5,--save-steps,10,--fail-at,27]"
    )
    job = [
        "cluster.tasks_per_node=1",
        "script.module=hpc_train.examples.hf_trainer",
        f"script.args={args}",
        f"tracking.mlflow.uri={store}",
        "tracking.mlflow.experiment=hf",
        "tracking.wandb.project=hf",
        "tracking.wandb.mode=offline",
    ]
    failed, run_dir = run_cli(*job, timeout=300)
    assert failed.returncode == 1 and "failing at step 27 on purpose" in failed.stderr, failed.stderr[-3000:]
    resumed, _ = run_cli(*job, run_dir=run_dir, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "starts.txt").read_text().split() == ["0", "20"]  # the second attempt resumed from step 20

    runs = {r.tracker: r for r in RunDir(run_dir).tracker_runs()}
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("hf")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [runs["mlflow"].run_id]
    steps = sorted(m.step for m in client.get_metric_history(runs["mlflow"].run_id, "loss"))
    assert steps == list(range(5, 41, 5)), steps  # 25 once, though trained twice

    rows = [values for _, _, values in offline_history(run_dir, runs["wandb"].run_id) if "train/loss" in values]
    assert [r["train/global_step"] for r in rows] == list(range(5, 41, 5))


def test_an_unreachable_tracker_is_one_warning_and_never_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0's logging against an MLflow server that is not there: the rows are taken without waiting, the
    attempt's end waits a bounded time, and one warning says the tracker is off."""
    import socket
    import time

    from hpc_train.config import Config, MlflowConfig, TrackingConfig
    from hpc_train.tracking import TrackerLog

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once (hpc_train's default: 2 retries)
    cfg = Config(tracking=TrackingConfig(mlflow=MlflowConfig(uri=f"http://127.0.0.1:{port}")))
    trackers = TrackerLog(RunDir(tmp_path), cfg, attempt=0)
    started = time.monotonic()
    trackers.start(0)
    for step in range(1, 50):
        trackers.row({"step": step, "train_loss": 1.0 / step})
    queued = time.monotonic() - started
    trackers.close("completed")
    assert queued < 1.0 and time.monotonic() - started < 35
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "could not create the MLflow run" in warnings[0], warnings
    assert RunDir(tmp_path).tracker_runs() == []


def test_a_lost_run_record_is_brought_back_from_the_checkpoint_ledger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """status/trackers.json gone (removed by hand, or damaged): the next launch continues
    the runs the checkpoint ledger names instead of beginning second ones, and MLflow says which steps it holds
    beyond the ledger's copy (as of its checkpoint), so that none is logged twice."""
    from mlflow.tracking import MlflowClient

    from hpc_train.config import Config, MlflowConfig, TrackingConfig, WandbConfig
    from hpc_train.tracking import ensure_runs
    from hpc_train.train.checkpoint import Checkpoints

    store = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = TrackingConfig(mlflow=MlflowConfig(uri=store, experiment="lost"), wandb=WandbConfig(project="lost"))
    cfg = Config(tracking=tracking)
    rd = RunDir(tmp_path / "run")
    made = {r.tracker: r for r in ensure_runs(rd, cfg)}
    for step in (5, 10, 15, 20):  # rank 0 logged up to 20; its record said 10 when the checkpoint of 15 was made
        MlflowClient(store).log_metric(made["mlflow"].run_id, "train_loss", 1.0 / step, step=step)
    for run in made.values():
        rd.write_tracker_run(replace(run, logged_step=10))
    Checkpoints(rd).save({"step": 15}, step=15, keep=2)
    rd.trackers.unlink()

    back = {r.tracker: r for r in ensure_runs(rd, cfg)}
    assert {name: r.run_id for name, r in back.items()} == {name: r.run_id for name, r in made.items()}
    assert back["mlflow"].logged_step == 20 and back["wandb"].logged_step == 10
    assert rd.tracker_runs() == list(back.values())
    experiment = MlflowClient(store).get_experiment_by_name("lost")
    assert len(MlflowClient(store).search_runs([experiment.experiment_id])) == 1
    assert sum("which the checkpoint ledger names" in r.getMessage() for r in caplog.records) == 2
