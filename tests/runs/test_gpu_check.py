"""The GPU check (scripts/gpu-check.sh, issue 56) on this CPU machine: without a GPU it skips the GPU parts and
says so; with --smoke it runs every part at toy sizes, so that a session lent a GPU finds it working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.slow

CHECK = REPO / "scripts" / "gpu-check.sh"


def check(out: Path, *args: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    """Run the check into ``out`` (its HOME beside it: matplotlib's cache stays out of it); its JSON and output."""
    done = subprocess.run(
        [str(CHECK), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(out.parent)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "gpu-check.json").read_text()), done.stdout


def test_without_a_gpu_the_check_measures_the_start_up_and_says_what_it_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    report, said = check(out)
    assert report["gpu"] is False and set(report["skipped"]) == {"tests", "bench", "checkpoint"}
    assert "not measured: bench (no GPU: torch sees none" in said
    startup = report["startup"]
    # (import torch alone and the rank's import phase are timed in different processes: on a loaded machine the
    # first came out longer than the second, so the test does not compare them)
    assert (
        startup["first_cuda_allocation_s"] is None and startup["import_torch_s"] > 0 and startup["import_phase_s"] > 0
    )
    assert startup["phases_s"]["first_step"] > 0 and 0 < startup["own_s"] < startup["import_phase_s"]
    assert startup["slowest_imports"][0][0] == "torch", startup["slowest_imports"]  # the heaviest, by far
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "importtime.txt"]


def test_the_smoke_run_goes_through_every_part_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    report, said = check(out, "--smoke")
    assert report["skipped"] == {} and report["tests"]["skipped"] == 12 and report["tests"]["exit"] == 0
    assert set(report["bench"]["summary"]) and report["bench"]["ratios"]["mlp/1"]["throughput_vs_limit"] > 0
    assert report["checkpoint"]["device"] == "cpu" and report["checkpoint"]["blocked_median_s"]["sync"] > 0
    assert "==== gpu-check figures ====" in said and "checkpoint (cpu" in said
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == ["bench-results.json", "bench.png", "gpu-check.json", "gpu-tests.log", "importtime.txt"]
