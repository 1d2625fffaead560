"""A run dir resumed on another shape keeps its global batch: the per-rank batch and accumulation are picked
before launch, or the resubmission is refused naming both shapes (``hpc_train.launch.reshape``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.api import compose_config
from hpc_train.config.shape import Shape, split_global_batch
from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config
from hpc_train.launch.reshape import reshaped

TWO_RANKS = ["trainer.batch_size=32", "cluster.tasks_per_node=2"]


@pytest.mark.parametrize(
    ("world", "batch", "accumulate", "expected"),
    [
        (1, 32, 1, (32, 2)),  # 2 ranks -> 1: the rank's batch stays, accumulation doubles
        (4, 32, 1, (16, 1)),  # 2 ranks -> 4: the rank's batch halves
        (2, 16, 2, (16, 2)),  # the same
        (8, 32, 1, (8, 1)),
        (6, 32, 1, None),  # 64 does not split over 6 ranks
        (3, 48, 1, None),
    ],
)
def test_the_split_keeps_the_global_batch(world: int, batch: int, accumulate: int, expected: object) -> None:
    got = split_global_batch(64, world, batch, accumulate)
    assert got == expected
    if got is not None:
        assert got[0] * world * got[1] == 64


def test_a_run_dir_resumes_on_another_rank_count_with_its_global_batch(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    write_config(compose_config(*TWO_RANKS), rd)
    one = write_config(compose_config("trainer.batch_size=32", "cluster.tasks_per_node=1"), rd)
    assert (one.trainer.batch_size, one.trainer.accumulate_grad_batches) == (32, 2)
    assert Shape.of(one).global_batch == 64
    # ... and back: from the saved 1 x 1 (accumulating 2), two ranks take 32 each again.
    two = write_config(compose_config(*TWO_RANKS), rd)
    assert (two.trainer.batch_size, two.trainer.accumulate_grad_batches) == (32, 1)
    # Each change of shape is on record, and jobs status says the last one.
    assert [(r.was.split(" (")[0], r.onto.split(" (")[0]) for r in rd.reshape_records()] == [
        ("1 node x 2 tasks", "1 node x 1 task"),
        ("1 node x 1 task", "1 node x 2 tasks"),
    ]
    from hpc_train.launch.state import reshapes_note

    (note,) = reshapes_note(rd.reshape_records())
    assert (
        note.startswith("resumed on 1 node x 2 tasks (global batch 64") and "(the last of 2 changes of shape)" in note
    )


def test_a_shape_that_cannot_keep_the_global_batch_is_refused(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    write_config(compose_config("trainer.batch_size=2", "cluster.tasks_per_node=2"), rd)  # global batch 4
    with pytest.raises(
        ConfigError, match=r"was trained on 1 node x 2 tasks \(global batch 4 .*does not split over 3 ranks.*HINT"
    ):
        reshaped(compose_config("trainer.batch_size=2", "cluster.tasks_per_node=3"), rd)
    with pytest.raises(ConfigError, match=r"keeps its global batch\. HINT: leave trainer\.batch_size"):
        reshaped(compose_config("trainer.batch_size=8", "cluster.tasks_per_node=1"), rd)
    # Your own split of the same global batch is taken as it is.
    mine, _ = reshaped(
        compose_config("trainer.batch_size=1", "trainer.accumulate_grad_batches=4", "cluster.tasks_per_node=1"), rd
    )
    assert (mine.trainer.batch_size, mine.trainer.accumulate_grad_batches) == (1, 4)


def test_another_shape_with_another_global_batch_is_still_refused_at_resubmission(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    write_config(compose_config(*TWO_RANKS), rd)
    with pytest.raises(ConfigError, match=r"already holds a run.*trainer\.batch_size: 32 -> 16"):
        write_config(compose_config("trainer.batch_size=16"), rd)  # the same shape, a smaller global batch


def test_a_refused_resubmission_on_another_shape_records_no_change_of_shape(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    write_config(compose_config(*TWO_RANKS), rd)
    with pytest.raises(ConfigError, match=r"already holds a run.*trainer\.lr: 0\.0001 -> 0\.5"):
        write_config(compose_config("trainer.batch_size=32", "cluster.tasks_per_node=1", "trainer.lr=0.5"), rd)
    assert rd.reshape_records() == []


def test_a_script_run_is_not_resumed_on_another_shape(tmp_path: Path) -> None:
    """A script's batch size and data order are its own: another shape would silently change its global batch,
    even when trainer.batch_size (which a script does not read) is changed to keep the product."""
    rd = RunDir(tmp_path)
    script = ["script.command=python", "script.args=[train.py]"]
    write_config(compose_config(*script, *TWO_RANKS), rd)
    for shape in (["cluster.tasks_per_node=1"], ["cluster.tasks_per_node=1", "trainer.batch_size=64"]):
        with pytest.raises(ConfigError, match=r"run by your own script on 1 x 2 .* asks for 1 x 1") as refused:
            write_config(compose_config(*script, "trainer.batch_size=32", *shape), rd)
        assert "HINT: resume with cluster.nodes=1 cluster.tasks_per_node=2" in str(refused.value)
    assert rd.reshape_records() == []
    write_config(compose_config(*script, *TWO_RANKS, "trainer.max_steps=7"), rd)  # the same shape goes on
