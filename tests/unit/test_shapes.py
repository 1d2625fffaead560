"""Which node count of a range finishes first (``hpc_train.launch.shapes``): candidates, step times and their
sources, the steps left, Slurm's answer through a stand-in sbatch, and the table. Real Slurm answers in
tests/integration/test_queue_shape_slurm.py."""

from __future__ import annotations

import json
import stat
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpc_train.core.errors import ConfigError
from hpc_train.core.records import AttemptRecord
from hpc_train.core.rundir import RunDir
from hpc_train.launch.sbatch import job_spec, render_sbatch
from hpc_train.launch.shapes import ShapeRow, ShapeTable, format_shape_table, shape_table
from hpc_train.runtime.estimates import (
    candidate_counts,
    kept_step,
    slurm_start_estimate,
    step_time,
    steps_left,
    study_step_seconds,
)
from hpc_train.tools.api import compose_config

RANGE = ["cluster=slurm", "cluster.nodes=8", "cluster.min_nodes=2", "cluster.tasks_per_node=2"]


def test_candidates_are_the_counts_the_global_batch_splits_over_at_most_eight() -> None:
    # A global batch of 16 ranks x 32 = 512 splits over 2, 4 and 8 nodes of 2 ranks, not over 6, 10, 12 or 14.
    assert candidate_counts(compose_config(*RANGE, "trainer.batch_size=32")) == [2, 4, 8]
    wide = compose_config("cluster=slurm", "cluster.nodes=64", "cluster.min_nodes=1", "trainer.batch_size=60")
    many = candidate_counts(wide)
    assert len(many) == 8 and many[0] == 1 and many[-1] == 64 and many == sorted(set(many))


def test_step_time_comes_from_the_run_then_the_study_then_linear_scaling() -> None:
    measured, study = {2: 0.4}, {8: 0.15}
    assert step_time(2, measured, study) == (0.4, "measured")
    assert step_time(8, measured, study) == (0.15, "scaling study")
    assert step_time(4, measured, study) == (pytest.approx(0.2), "linear from 2 (measured)")
    assert step_time(6, measured, study) == (pytest.approx(0.2), "linear from 8 (study)")
    assert step_time(4, {}, {}) == (None, "")


def test_a_scaling_study_gives_step_times_for_this_global_batch(tmp_path: Path) -> None:
    table = tmp_path / "scaling.json"
    points = [
        {"mode": "strong", "world_size": 4, "samples_per_s": 1000.0},
        {"mode": "strong", "world_size": 8, "samples_per_s": 1600.0},
        {"mode": "weak", "world_size": 8, "samples_per_s": 9999.0},
        {"mode": "strong", "world_size": 3, "samples_per_s": 900.0},  # not whole nodes of 2 ranks
    ]
    table.write_text(json.dumps({"points": points}))
    cfg = compose_config(*RANGE, "trainer.batch_size=32", f"cluster.slurm.scaling={table}")
    # global batch 16 ranks x 32 = 512 samples: 0.512 s a step on 2 nodes, 0.32 s on 4
    assert study_step_seconds(cfg) == {2: pytest.approx(0.512), 4: pytest.approx(0.32)}
    table.write_text("{}")
    with pytest.raises(ConfigError, match=r"cluster.slurm.scaling=.*not a scaling study's table.*HINT"):
        study_step_seconds(cfg)


def test_steps_left_count_from_the_newest_checkpoint() -> None:
    cfg = compose_config(*RANGE, "trainer.max_steps=500", "trainer.max_epochs=0")
    assert kept_step([]) == 0 and steps_left(cfg, 0) == 500
    done = {"first_step": 1, "first_time": 10.0, "step": 130, "time": 40.0, "checkpoint_step": 120}
    attempts = [AttemptRecord.from_json({"attempt": 0, "outcome": "stopped", "progress": done})]
    assert kept_step(attempts) == 120 and steps_left(cfg, kept_step(attempts)) == 380
    # Synthetic data: epochs x whole global batches of the training set.
    epochs = compose_config(*RANGE, "trainer.max_epochs=2", "data.num_samples=10000", "trainer.batch_size=32")
    assert steps_left(epochs, 0) == 2 * (9000 // 512)
    # A data set of the user's is sized only when it is built.
    users = compose_config(
        *RANGE,
        "trainer.max_epochs=2",
        "data.dataset={_target_: torch.utils.data.TensorDataset}",
        "data.input_shape=[4]",
    )
    assert steps_left(users, 0) is None


SBATCH = """\
import re, sys
given = [a for a in sys.argv[1:-1] if a.startswith("--nodes=")]  # the command line wins over the script's
text = given[-1] if given else open(sys.argv[-1]).read()
nodes = int(re.search(r"--nodes=(\\d+)", text).group(1))
if nodes > 6:
    print("sbatch: error: Batch job submission failed: Node count specification invalid", file=sys.stderr)
    sys.exit(1)
when = "2031-05-04T10:00:00" if nodes <= 2 else "2031-05-04T11:00:00"
print(f"sbatch: Job 7 to start at {when} using 4 processors on nodes node[1-{nodes}] in partition p", file=sys.stderr)
"""


def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f"#!{sys.executable}\n{SBATCH}")
    (bindir / "sbatch").chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin")


def test_slurm_is_asked_for_each_count_and_the_table_says_which_finishes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sbatch(tmp_path, monkeypatch)
    cfg = compose_config(*RANGE, "trainer.batch_size=32", "trainer.max_steps=36000", "trainer.max_epochs=0")
    rd = RunDir(tmp_path / "run")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job_spec(cfg.cluster, [rd.path], rd.path / "logs")))
    soon = datetime.fromisoformat("2031-05-04T10:00:00").timestamp()
    assert slurm_start_estimate(script, "--nodes=2") == (soon, "")
    start, why = slurm_start_estimate(script, "--nodes=8")
    assert start is None and "Slurm refuses --nodes=8: sbatch: error: Batch job submission failed" in why

    rd.status_dir.mkdir(parents=True)
    two = {"first_step": 1, "first_time": 100.0, "step": 101, "time": 200.0}  # 1 s a step on 2 nodes
    rd.write_attempts(
        [
            AttemptRecord.from_json(
                {"attempt": 0, "outcome": "stopped", "nodes": ["a", "b"], "start": 90.0, "progress": two}
            )
        ]
    )
    table = shape_table(cfg, rd, script, now=soon - 600)
    assert [r.nodes for r in table.rows] == [2, 4, 8] and table.steps_left == 36000 and table.startup_s == 10.0
    by = {r.nodes: r for r in table.rows}
    assert by[2].finish == soon + 10 + 36000 * 1.0
    assert by[4].step_s == 0.5 and by[4].step_source == "linear from 2 (measured)"
    assert by[4].finish == soon + 3600 + 10 + 18000  # an hour later, but half the step time: first to finish
    assert by[8].finish is None and table.earliest is not None and table.earliest.nodes == 4
    text = format_shape_table(table, "asking for 2-8 nodes", "earliest_finish")
    assert "2031-05-04 11:00:00 (in 70 min)" in text and "? (Slurm refuses --nodes=8" in text
    assert text.endswith("cluster.slurm.shape=earliest_finish: submitting 4 nodes, the first to finish.")


def test_without_estimates_the_table_says_so_instead_of_guessing() -> None:
    now = time.time()
    rows = (ShapeRow(nodes=2, start=None, start_note="no sbatch here: Slurm gives no estimate"),)
    text = format_shape_table(
        ShapeTable(rows=rows, steps_left=None, startup_s=None, asked_at=now), "asking for 2-4 nodes", "earliest_finish"
    )
    assert "? (no sbatch here: Slurm gives no estimate)" in text
    assert "no finish time estimated: Slurm gave no start time; no step time is measured" in text
    assert "the steps left are not known" in text and text.endswith("nothing to choose by; submitting the range.")


def test_earliest_finish_needs_a_range() -> None:
    with pytest.raises(
        ConfigError,
        match=r"cluster.slurm.shape='earliest_finish' is invalid.*fixed 4 nodes.*HINT: set cluster.min_nodes",
    ):
        compose_config("cluster=slurm", "cluster.nodes=4", "cluster.slurm.shape=earliest_finish")
    with pytest.raises(
        ConfigError, match=r"cluster.slurm.shape=.soonest. is invalid: must be one of range, earliest_finish"
    ):
        compose_config(*RANGE, "cluster.slurm.shape=soonest")
