"""The benchmark driver's bookkeeping, and that every variant trains the same model as hpc_train."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
from workloads import WORKLOADS, measure_marks  # noqa: E402

from hpc_train.api import compose_config  # noqa: E402
from hpc_train.train.models import build_model  # noqa: E402


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_hpc_train_builds_the_reference_model(name: str, tmp_path: Path) -> None:
    workload = WORKLOADS[name]
    setup = compare.Setup(10, 20, 2, "cpu", "fp32", 60, tmp_path)
    overrides = [o for o in compare.hpc_train_overrides(workload, 2, setup, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_config(*overrides)
    ours = build_model(cfg.model, cfg.data.input_shape, cfg.data.num_classes)
    theirs = workload.build()
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in theirs.state_dict().items()
    ]
    assert cfg.trainer.batch_size == workload.batch_size and cfg.cluster.cpus_per_task == 1
    assert cfg.data.num_samples == workload.samples_needed(30, 2) and cfg.data.num_val == 0


def test_schedule_interleaves_and_rotates() -> None:
    order = compare.schedule(["a", "b", "c"], ["mlp"], [1, 2], repeats=2)
    assert [v for _, _, r, v in order if r == 1] == ["a", "b", "c", "b", "c", "a"]
    assert len(order) == 12


def test_ratios_and_targets() -> None:
    samples = [
        compare.Sample("mlp", 2, "hpc_train", 0, 2.0, 1000.0),
        compare.Sample("mlp", 2, "hpc_train", 1, 3.0, 1010.0),
        compare.Sample("mlp", 2, "raw", 0, 4.0, 1000.0),
        compare.Sample("mlp", 2, "lightning", 0, 6.0, 900.0),
        compare.Sample("mlp", 1, "hpc_train", 0, 2.0, 800.0),
        compare.Sample("mlp", 1, "limit", 0, 1.0, 1000.0),
    ]
    summary = compare.summarize(samples)
    assert summary["mlp/2/hpc_train"]["samples_per_s"] == {"median": 1005.0, "min": 1000.0, "max": 1010.0, "n": 2}
    ratio = compare.ratios(summary)
    assert ratio["mlp/2"]["throughput_vs_raw"] == pytest.approx(1.005)
    assert ratio["mlp/2"]["first_step_vs_lightning"] == pytest.approx(2.5 / 6.0)
    met = {what: ok for what, _, _, ok in compare.targets(ratio)}
    assert met["throughput >= 0.99x raw at 2 ranks"] and met["first step <= 0.5x Lightning at 2 ranks"]
    assert not met["1-rank step time <= 1.10x compute loop"]  # 1000/800 = 1.25


def test_window_marks_must_fall_on_logging_steps() -> None:
    assert measure_marks(10, 40) == (10, 50)
    with pytest.raises(ValueError, match="multiples of 10"):
        measure_marks(5, 40)


def test_trace_summary_counts_steps_gpu_busy_time_and_syncs() -> None:
    from trace_summary import summarise

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 1000, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 100, "dur": 300},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 300, "dur": 300},  # overlaps the first: counted once
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 1100, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1500, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 50, "dur": 200},
    ]
    s = summarise(events)
    assert (s["steps"], s["step_ms"], s["kernels_per_step"], s["syncs_per_step"]) == (2, 1.0, 1.0, 0.5)
    assert s["gpu_busy"] == pytest.approx(600 / 1100)  # busy 100-600 and 1100-1200 over a span of 100-1200
    assert s["top_kernels_ms_per_step"] == [("gemm", 0.3)]
