"""The scaling study's arithmetic: which runs, speed-up, efficiency, recommendation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_train.core.errors import ConfigError
from hpc_train.core.records import RecordError, ScalingStudy
from hpc_train.tools import scaling
from hpc_train.tools.scaling import Point, plan, recommend, summarize, throughput


def test_plan_strong_and_weak_shapes() -> None:
    points = plan([1, 2, 4], tasks_per_node=2, base_batch=64, modes=["strong", "weak"], data_sizes=[None])
    assert [(p.mode, p.world_size, p.nodes, p.tasks_per_node, p.batch_size) for p in points] == [
        ("strong", 1, 1, 1, 64),
        ("strong", 2, 1, 2, 32),
        ("strong", 4, 2, 2, 16),
        ("weak", 1, 1, 1, 64),
        ("weak", 2, 1, 2, 64),
        ("weak", 4, 2, 2, 64),
    ]
    assert points[2].overrides() == ["cluster.nodes=2", "cluster.tasks_per_node=2", "trainer.batch_size=16"]


def test_plan_with_data_sizes() -> None:
    points = plan([1, 2], 2, 8, ["weak"], [1000, 4000])
    assert [p.name for p in points] == ["weak-w1-n1000", "weak-w2-n1000", "weak-w1-n4000", "weak-w2-n4000"]
    assert points[-1].overrides()[-1] == "data.num_samples=4000"


@pytest.mark.parametrize(
    ("worlds", "per_node", "message"),
    [
        ([1, 3], 4, r"splits a global batch of 64 over 3 ranks unevenly"),
        ([1, 2, 3], 2, r"3 ranks do not fill nodes of 2"),
    ],
)
def test_plan_refuses_uneven_splits(worlds: list[int], per_node: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(worlds, per_node, 64, ["strong"], [None])


def test_summary_and_recommendation() -> None:
    points = [Point("strong", w, 1, w, 64 // w) for w in (1, 2, 4)] + [Point("weak", w, 1, w, 64) for w in (1, 2, 4)]
    table = summarize(points, [100.0, 180.0, 200.0, 100.0, 190.0, 360.0])
    assert [round(r.speedup or 0, 2) for r in table] == [1.0, 1.8, 2.0, 1.0, 1.9, 3.6]
    assert [round(r.efficiency or 0, 2) for r in table] == [1.0, 0.9, 0.5, 1.0, 0.95, 0.9]
    assert recommend(table, 0.7) == {"strong": 2, "weak": 4}
    assert recommend(table, 0.99) == {"strong": 1, "weak": 1}


def test_the_study_s_table_is_the_json_it_was() -> None:
    """scaling.json as the study wrote it before its rows were typed reads back to the same JSON, key for key;
    cluster.slurm.scaling reads it through the same record."""
    written = {
        "points": [
            {
                "mode": "strong",
                "world_size": 2,
                "nodes": 1,
                "tasks_per_node": 2,
                "batch_size": 32,
                "data_size": None,
                "samples_per_s": 1800.0,
                "speedup": 1.8,
                "efficiency": 0.9,
            }
        ],
        "threshold": 0.7,
        "recommended": {"strong": 2},
    }
    study = ScalingStudy.from_json(written)
    assert study.points[0].efficiency == 0.9 and study.recommended == {"strong": 2}
    assert json.dumps(study.to_json()) == json.dumps(written)  # the same keys in the same order
    with pytest.raises(RecordError, match=r"points=.* is not a list of ScalingPoint records"):
        ScalingStudy.from_json({"points": [{**written["points"][0], "world_size": "2"}]})


def test_throughput_skips_the_first_row() -> None:
    assert throughput([{"samples_per_s": 10.0}, {"samples_per_s": 100.0}, {"samples_per_s": 120.0}]) == 110.0
    assert throughput([{"samples_per_s": 10.0}]) == 10.0


class _FinishedRun:
    """What run_study reads of a finished run: its metrics rows."""

    def __init__(self, samples_per_s: float) -> None:
        self.rows = [{"samples_per_s": samples_per_s}]

    def result(self, timeout: float | None = None) -> dict[str, str]:
        return {"state": "COMPLETED"}

    def metrics(self) -> list[dict[str, float]]:
        return self.rows


def test_strong_and_weak_share_the_smallest_world_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One job for the two rows that are the same run; the table still has both."""
    submitted: list[tuple[str, ...]] = []

    def submit(*overrides: str, run_dir: Path) -> _FinishedRun:
        submitted.append((run_dir.name, *overrides))
        return _FinishedRun(100.0 * len(submitted))

    monkeypatch.setattr(scaling, "submit", submit)
    points = plan([1, 2], 2, 8, ["strong", "weak"], [None])
    values = scaling.run_study(points, ["trainer.max_steps=3"], tmp_path, timeout_s=1)
    assert [s[0] for s in submitted] == ["strong-w1", "strong-w2", "weak-w2"]
    assert submitted[0][1:] == (
        "trainer.max_steps=3",
        "cluster.nodes=1",
        "cluster.tasks_per_node=1",
        "trainer.batch_size=8",
    )
    assert values == [100.0, 200.0, 100.0, 300.0]
