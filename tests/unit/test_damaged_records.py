"""Damaged run-dir records: status files and attempts.json with wrong types, bad metrics.jsonl rows, a metrics.jsonl
that is a symbolic link, and a config.yaml restored from a checkpoint (``jobs restore-config``).

Each run dir here is built as a launcher builds one: the composed default config in config.yaml, overrides.json,
statuses written by ``RunDir.write_status``; then one record is damaged the way a full disk or a stray tool would.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from hpc_train.config import Config, load_config
from hpc_train.core.errors import ConfigError
from hpc_train.core.metrics import MetricsWriter, drop_rows_after, last_metrics, read_metrics
from hpc_train.core.rundir import RunDir, write_json_atomic
from hpc_train.tools.jobs import main as jobs_main
from hpc_train.train.checkpoint import REQUIRED_KEYS


@pytest.fixture(scope="module")
def composed() -> Config:
    from hpc_train.tools.api import compose_config

    return compose_config("trainer.max_steps=77")  # 2 local ranks by default


@pytest.fixture
def run_dir(tmp_path: Path, composed: Config, monkeypatch: pytest.MonkeyPatch) -> RunDir:
    """A local run (no job.json: no scheduler is asked) whose 2 ranks are running at step 40."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.config.write_text(OmegaConf.to_yaml(OmegaConf.structured(composed)))
    rd.write_overrides(["trainer.max_steps=77"])
    for rank in range(2):
        rd.write_status(rank, "running", step=40)
    return rd


def patch_status(rd: RunDir, rank: int, **changes: Any) -> None:
    record = json.loads(rd.status_path(rank).read_text())
    write_json_atomic(rd.status_path(rank), {**record, **changes})


# ---- jobs status: damaged status/*.json and attempts.json --------------------------------------------------------


DAMAGE: dict[str, tuple[str, str, str]] = {
    # name: (file under status/, its content, what the report says)
    "rank not a number, state not a state": ("rank_1.json", '{"rank": "x", "state": 5}', "rank='x' is not a rank"),
    "a list instead of an object": ("rank_1.json", "[1, 2, 3]", "holds a JSON list, not an object"),
    "truncated": ("rank_1.json", '{"rank": 1, "state": "runn', "not valid JSON"),
    "garbage bytes": ("rank_1.json", "\udcff\udcfe\x00", "not valid JSON"),
    "attempts: entries of the wrong type": (
        "attempts.json",
        '[1, "x", {"outcome": 3}]',
        "entry 2: outcome=3 is not an outcome",
    ),
    "attempts: an object instead of a list": ("attempts.json", '{"attempt": 0}', "holds a JSON dict, not a list"),
    "attempts: failure and progress of the wrong type": (
        "attempts.json",
        '[{"attempt": 0, "outcome": "failed", "failure": "boom", "progress": [3], "start": "then"}]',
        "entry 0: failure='boom' is not a JSON object",
    ),
    "attempts: truncated": ("attempts.json", '[{"attempt": 0, "outc', "not valid JSON"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_status_reports_a_damaged_file_and_shows_the_rest(
    name: str, run_dir: RunDir, capsys: pytest.CaptureFixture[str]
) -> None:
    file, content, says = DAMAGE[name]
    path = run_dir.status_dir / file
    path.write_bytes(content.encode(errors="surrogateescape"))
    assert jobs_main(["status", str(run_dir.path)]) == 0
    out = capsys.readouterr().out
    assert "damaged records (left out of the state above):" in out
    damaged = [line for line in out.splitlines() if line.startswith(f"  {path}: ")]
    assert any(says in line for line in damaged), out
    assert "HINT:" in out
    row = out.splitlines()[1].split()  # the run's row is still there, with what the records that are whole say
    assert row[:3] == [str(run_dir.path), "-", "RUNNING"]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"step": "abc"}, "step='abc' is not a step number"),
        ({"state": 5}, "state=5 is none of starting, running"),
        ({"pid": "x"}, "pid='x' is not a process id"),
        ({"time": [1]}, "time=[1] is not a time stamp"),
        ({"pid_start": "soon"}, "pid_start='soon' is not an integer"),
    ],
)
def test_status_drops_a_value_of_the_wrong_type(
    changes: dict[str, Any], says: str, run_dir: RunDir, capsys: pytest.CaptureFixture[str]
) -> None:
    patch_status(run_dir, 1, **changes)
    assert jobs_main(["status", "--json", str(run_dir.path)]) == 0
    record = json.loads(capsys.readouterr().out)[0]
    assert len(record["damaged"]) == 1 and record["damaged"][0].startswith(f"{run_dir.status_path(1)}: {says}")
    assert record["step"] == 40  # rank 0's step, and rank 1's when only its state is damaged


def test_status_of_a_stopped_script_that_reported_no_step(run_dir: RunDir, capsys: pytest.CaptureFixture[str]) -> None:
    """step=None is what a script that never reports a step leaves: no damage, and no int(None)."""
    for rank in range(2):
        run_dir.write_status(rank, "stopped", step=None)
    assert jobs_main(["status", "--json", str(run_dir.path)]) == 0
    record = json.loads(capsys.readouterr().out)[0]
    assert (record["state"], record["step"], record["damaged"]) == ("STOPPED", 0, [])


def test_a_sweep_element_whose_config_does_not_parse_does_not_hide_the_others(
    tmp_path: Path, composed: Config, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    sweep = tmp_path / "multirun"
    for i in range(2):
        rd = RunDir(sweep / str(i))
        rd.path.mkdir(parents=True)
        rd.config.write_text(OmegaConf.to_yaml(OmegaConf.structured(composed)))
        rd.write_status(0, "completed", step=5)
        rd.write_status(1, "completed", step=5)
    (sweep / "1" / "config.yaml").write_text("cluster: {tasks_per_node: 2\n")  # cut short
    assert jobs_main(["status", str(sweep)]) == 2
    captured = capsys.readouterr()
    assert f"{sweep / '0'} " in captured.out and "COMPLETED" in captured.out
    assert f"{sweep / '1' / 'config.yaml'} cannot be read (ParserError" in captured.err
    assert f"HINT: restore it from the newest checkpoint: python -m hpc_train.jobs restore-config {sweep / '1'}" in (
        captured.err
    )


# ---- metrics.jsonl ----------------------------------------------------------------------------------------------


GOOD = [{"step": 10, "train_loss": 1.5}, {"step": 20, "val_loss": 2.0}, {"step": 30, "train_loss": 1.0}]
BAD = [b"\xff\xfe garbage \x00", b"[1, 2, 3]", b'{"step": "x", "train_loss": 9.0}']


def damaged_metrics(path: Path) -> bytes:
    lines = [json.dumps(GOOD[0]).encode(), BAD[0], BAD[1], json.dumps(GOOD[1]).encode(), BAD[2]]
    content = b"\n".join([*lines, json.dumps(GOOD[2]).encode()]) + b"\n"
    path.write_bytes(content)
    return content


def test_bad_metrics_rows_are_skipped_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    damaged_metrics(path)
    with caplog.at_level(logging.WARNING, logger="hpc_train.core.metrics"):
        assert read_metrics(path) == GOOD
        assert last_metrics(path) == {"step": 30, "train_loss": 1.0, "val_loss": 2.0}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # the second read of the same damage says nothing more
    assert warnings[0].startswith(f"{path}: skipped 3 bad row(s)") and "HINT:" in warnings[0]


def test_drop_rows_after_keeps_bad_rows_and_every_good_row_up_to_the_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    damaged_metrics(path)
    with path.open("ab") as f:
        f.write(b'{"step": 40, "train_lo')  # torn: the rank writing it died
    drop_rows_after(path, 20)
    lines = path.read_bytes().split(b"\n")
    assert lines == [json.dumps(GOOD[0]).encode(), BAD[0], BAD[1], json.dumps(GOOD[1]).encode(), BAD[2], b""]
    assert read_metrics(path) == GOOD[:2]
    with path.open("a") as f:  # the resumed run's next row starts on a line of its own
        f.write(json.dumps({"step": 21, "train_loss": 0.5}) + "\n")
    assert [r["step"] for r in read_metrics(path)] == [10, 20, 21]


def test_metrics_writer_appends_and_refuses_a_symbolic_link(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for step in (1, 2):
        writer = MetricsWriter(path, enabled=True)
        writer.write({"step": step})
        writer.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.unlink()
    elsewhere = tmp_path / "someone_elses.jsonl"
    elsewhere.write_text("theirs\n")
    path.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=f"{path} is a symbolic link .*HINT: remove the link") as raised:
        MetricsWriter(path, enabled=True)
    assert str(elsewhere) in str(raised.value)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        drop_rows_after(path, 10)
    assert elsewhere.read_text() == "theirs\n" and path.is_symlink()
    MetricsWriter(path, enabled=False).write({"step": 3})  # ranks other than 0 open nothing
    path.unlink()
    path.symlink_to(tmp_path / "nowhere.jsonl")  # a dangling link is not followed to create its target either
    with pytest.raises(ConfigError, match="is a symbolic link"):
        MetricsWriter(path, enabled=True)
    assert not (tmp_path / "nowhere.jsonl").exists()


# ---- jobs restore-config -----------------------------------------------------------------------------------------


def save_checkpoint(rd: RunDir, step: int, composed: Config) -> Path:
    state: dict[str, Any] = {key: {} for key in REQUIRED_KEYS}
    state |= {"step": step, "epoch": 0, "step_in_epoch": step, "rng": []}
    state["config"] = OmegaConf.to_container(OmegaConf.structured(composed))
    rd.checkpoint(step).parent.mkdir(exist_ok=True)
    torch.save(state, rd.checkpoint(step))  # as a run from before the checkpoint ledger wrote it: it trained,
    rd.logs.mkdir(exist_ok=True)  # so its rank 0 log is there
    (rd.logs / "rank_0.log").touch()
    return rd.checkpoint(step)


def test_restore_config_from_the_newest_loadable_checkpoint(
    run_dir: RunDir, composed: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    older = save_checkpoint(run_dir, 10, composed)
    run_dir.checkpoint(20).write_bytes(b"torn")  # the newest is damaged: skipped
    damaged = b"cluster: {tasks_per_node: 2\n\xff"
    run_dir.config.write_bytes(damaged)
    assert jobs_main(["status", str(run_dir.path)]) == 2
    assert "restore-config" in capsys.readouterr().err
    assert jobs_main(["restore-config", str(run_dir.path)]) == 0
    out = capsys.readouterr().out
    assert f"restored {run_dir.config} (UnicodeDecodeError" in out and f"from the config in {older} (step 10)" in out
    assert f"kept as {run_dir.path / 'config.yaml.damaged'}" in out
    assert (run_dir.path / "config.yaml.damaged").read_bytes() == damaged
    assert load_config(run_dir.config) == composed and load_config(run_dir.config).trainer.max_steps == 77
    assert jobs_main(["status", str(run_dir.path)]) == 0  # the run dir is whole again


def test_restore_config_when_it_is_missing_and_a_damaged_copy_is_already_kept(
    run_dir: RunDir, composed: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    save_checkpoint(run_dir, 10, composed)
    run_dir.config.unlink()
    assert jobs_main(["status", str(run_dir.path)]) == 2
    assert f"HINT: restore it from the newest checkpoint: python -m hpc_train.jobs restore-config {run_dir.path}" in (
        capsys.readouterr().err
    )
    assert jobs_main(["restore-config", str(run_dir.path)]) == 0
    assert f"restored {run_dir.config} (missing)" in capsys.readouterr().out
    assert load_config(run_dir.config) == composed and not (run_dir.path / "config.yaml.damaged").exists()
    (run_dir.path / "config.yaml.damaged").write_text("an earlier one\n")
    run_dir.config.write_text("cluster: {spare_nodes: -1}\n")  # parses, but does not validate
    assert jobs_main(["restore-config", str(run_dir.path)]) == 0
    assert "(ConfigError: " in capsys.readouterr().out
    assert (run_dir.path / "config.yaml.damaged").read_text() == "an earlier one\n"
    assert (run_dir.path / "config.yaml.damaged.1").read_text() == "cluster: {spare_nodes: -1}\n"


def test_restore_config_refuses_without_a_checkpoint_or_over_a_good_config(
    run_dir: RunDir, composed: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    good = run_dir.config.read_text()
    assert jobs_main(["restore-config", str(run_dir.path)]) == 1
    assert f"{run_dir.config} loads and validates; nothing to restore. HINT:" in capsys.readouterr().err
    run_dir.config.write_text("{{{")
    assert jobs_main(["restore-config", str(run_dir.path)]) == 1
    err = capsys.readouterr().err
    assert f"{run_dir.checkpoints} holds no loadable checkpoint. HINT:" in err
    assert run_dir.config.read_text() == "{{{" and not (run_dir.path / "config.yaml.damaged").exists()
    path = save_checkpoint(run_dir, 10, composed)
    state = torch.load(path, weights_only=True)
    del state["config"]
    torch.save(state, path)
    assert jobs_main(["restore-config", str(run_dir.path)]) == 1
    assert f"{path} holds no config" in capsys.readouterr().err
    assert run_dir.config.read_text() == "{{{" and good != "{{{"
    assert sorted(p.name for p in run_dir.path.iterdir() if p.name.startswith((".config", "config"))) == ["config.yaml"]


def test_restore_config_of_no_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert jobs_main(["restore-config", str(tmp_path / "nothing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not os.path.lexists(tmp_path / "nothing")
