"""The tracking config, the run record and what a script gets: pure functions and a run dir on disk."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hpc_train.config import Config, MlflowConfig, MLPConfig, SGDConfig, TrackingConfig, WandbConfig, config_from_dict
from hpc_train.core.errors import ConfigError
from hpc_train.core.records import AttemptOutcome, AttemptRecord, RequeueEntry, TrackerRun
from hpc_train.core.rundir import RunDir
from hpc_train.launch.preflight import check_trackers
from hpc_train.tracking import attempt_note, ensure_runs, row_values, script_environment


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "http://10.77.0.1:5000",
        "https://mlflow.example.org",
        "sqlite:////shared/mlflow.db",
        "file:///shared/mlruns",
        "/shared/mlruns",
        "postgresql://user@db/mlflow",
        "databricks",
    ],
)
def test_tracking_stores_that_every_node_sees_are_taken(uri: str) -> None:
    assert MlflowConfig(uri=uri).uri == uri


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("sqlite:///mlflow.db", "absolute path.*sqlite:////abs/path/mlflow.db"),
        ("mlruns", "absolute path"),
        ("htp://host:5000", "tracking server"),
        ("http://host:5000\nrm -rf ~", "control character"),
    ],
)
def test_a_store_that_would_differ_per_node_is_refused_naming_the_key(uri: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.uri.*" + says):
        MlflowConfig(uri=uri)


def test_wandb_mode_and_names_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"tracking\.wandb\.mode='ofline'.*did you mean 'offline'"):
        WandbConfig(project="p", mode="ofline")
    with pytest.raises(ConfigError, match=r"tracking\.wandb\.project='a/b'"):
        WandbConfig(project="a/b")


def test_tracking_keys_come_from_a_saved_config() -> None:
    raw = OmegaConf.to_container(OmegaConf.structured(Config(model=MLPConfig(), optim=SGDConfig())))
    assert isinstance(raw, dict)
    raw["tracking"] = {"mlflow": {"uri": "http://h:5000"}, "wandb": {"project": "p"}}
    cfg = config_from_dict(raw)
    assert cfg.tracking.mlflow.enabled and cfg.tracking.wandb.enabled and cfg.tracking.mlflow.experiment == "hpc_train"
    assert not Config().tracking.enabled


def test_a_missing_tracker_package_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = Config(tracking=TrackingConfig(wandb=WandbConfig(project="demo")))
    with pytest.raises(ConfigError, match=r"tracking\.wandb\.project='demo'.*pip install 'hpc-train\[wandb\]'"):
        check_trackers(cfg)


def test_a_script_gets_the_ids_kept_in_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_DIR", raising=False)
    rd = RunDir(tmp_path)
    cfg = Config(tracking=TrackingConfig(wandb=WandbConfig(project="demo", mode="offline", entity="team")))
    (first,) = ensure_runs(rd, cfg)
    (again,) = ensure_runs(rd, cfg)  # idempotent: the id made once is the one every attempt gets
    assert first == again and len(first.run_id) == 8 and first.store == "team/demo"
    assert script_environment(rd, cfg) == {
        "WANDB_PROJECT": "demo",
        "WANDB_ENTITY": "team",
        "WANDB_MODE": "offline",
        "WANDB_RESUME": "allow",
        "WANDB_RUN_ID": first.run_id,
        "WANDB_DIR": str(tmp_path),
    }
    monkeypatch.setenv("WANDB_DIR", "/elsewhere")  # the user's own choice stays
    assert "WANDB_DIR" not in script_environment(rd, cfg)
    assert script_environment(rd, Config()) == {}


def test_the_record_keeps_one_run_per_tracker_and_store(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.write_tracker_run(TrackerRun(tracker="mlflow", store="http://a", run_id="1"))
    rd.write_tracker_run(TrackerRun(tracker="mlflow", store="http://b", run_id="2"))
    rd.write_tracker_run(TrackerRun(tracker="mlflow", store="http://a", run_id="1", logged_step=40))
    assert [(r.store, r.logged_step) for r in rd.tracker_runs()] == [("http://b", None), ("http://a", 40)]
    assert rd.tracker_run("mlflow", "http://a") == TrackerRun(
        tracker="mlflow", store="http://a", run_id="1", logged_step=40
    )


def test_an_attempt_says_where_it_starts_and_after_what(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert attempt_note(rd, 0, 0) == "attempt 0: from step 0"
    assert attempt_note(rd, 1, 15) == "attempt 1: resumed from step 15 after a relaunch of the run dir"
    rd.status_dir.mkdir()
    rd.append_restart(RequeueEntry(attempt=1, resumed_step=15, stopped_step=22, signal=12))
    assert attempt_note(rd, 2, 22) == "attempt 2: resumed from step 22 after a stop on signal 12 at step 22"
    rd.write_attempts([AttemptRecord(attempt=2, outcome=AttemptOutcome.FAILED)])
    assert attempt_note(rd, 3, 22) == "attempt 3: resumed from step 22 after attempt 2 failed"


def test_a_row_gives_its_numbers_but_not_its_step_or_flags() -> None:
    row = {"step": 10, "epoch": 0, "train_loss": 0.5, "lr": 1e-3, "early_stop": True, "note": "x"}
    assert row_values(row) == {"epoch": 0.0, "train_loss": 0.5, "lr": 1e-3}


def test_an_mlflow_run_resumes_after_the_latest_step_the_server_holds(tmp_path: Path) -> None:
    """An attempt ended while its row of step 10 was on its way: MLflow holds it, the record says 5. The next
    attempt must not send 10 again (MLflow would keep both)."""
    from mlflow.tracking import MlflowClient

    from hpc_train.tracking.log import _Mlflow

    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=store)
    run_id = client.create_run(client.create_experiment("held")).info.run_id
    for step in (5, 10):
        client.log_metric(run_id, "train_loss", 1.0 / step, step=step)
    backend = _Mlflow(TrackerRun(tracker="mlflow", store=store, run_id=run_id, created=1.0, logged_step=5))
    backend.open(1, "attempt 1", {})
    assert backend.sent == 10


def _wandb_file(path: Path, steps: list[int], chunk: int = 10_000) -> bytes:
    """A W&B run file as its writer lays it out: the header, then each history record in chunks of at most
    ``chunk`` bytes (first, middle, last parts), none across a 32 KiB block's end (padded with zeros)."""
    import struct
    import zlib

    from wandb.proto import wandb_internal_pb2

    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for step in steps:
        record = wandb_internal_pb2.Record()
        record.history.step.num = step
        item = record.history.item.add()
        item.key, item.value_json = "train_loss", "0.5" + "0" * 30_000  # spans chunks and blocks
        data = record.SerializeToString()
        parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        for n, part in enumerate(parts):
            room = 32 * 1024 - len(out) % (32 * 1024)
            if room < 7 + len(part):
                out += bytes(room)
            kind = 1 if len(parts) == 1 else 2 if n == 0 else 4 if n == len(parts) - 1 else 3
            out += struct.pack("<IHB", zlib.crc32(part, zlib.crc32(bytes([kind]))), len(part), kind) + part
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return bytes(out)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb, from the test extra")
def test_the_latest_w_and_b_offline_step_is_read_up_to_a_cut_off_or_damaged_chunk(tmp_path: Path) -> None:
    from hpc_train.tracking.wandb_files import offline_step

    assert offline_step(tmp_path, "abc") is None  # no folder
    first = tmp_path / "wandb" / "offline-run-20261127_100000-abc" / "run-abc.wandb"
    _wandb_file(first, [5, 10, 15])
    second = tmp_path / "wandb" / "offline-run-20261127_110000-abc" / "run-abc.wandb"
    data = _wandb_file(second, [20, 25])
    _wandb_file(tmp_path / "wandb" / "offline-run-20261127_120000-other" / "run-other.wandb", [99])
    assert offline_step(tmp_path, "abc") == 25  # every folder of the run, no other run's

    second.write_bytes(data[:-100])  # the writer killed in the middle of step 25's last chunk
    assert offline_step(tmp_path, "abc") == 20
    damaged = bytearray(data)
    damaged[-50] ^= 0xFF
    second.write_bytes(bytes(damaged))
    assert offline_step(tmp_path, "abc") == 20
    second.write_bytes(b"")  # an attempt that ended inside wandb.init
    assert offline_step(tmp_path, "abc") == 15
    second.write_bytes(b"not a W&B file at all")
    with pytest.raises(ValueError, match="not a W&B run file"):
        offline_step(tmp_path, "abc")
