"""benchmarks/recovery.py at its smallest size on the Slurm testbed (the rest of benchmarks/ runs in
tests/runs/test_benchmarks_smoke.py): it runs to its end and prints the figures docs/recovery.md quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..runs.test_benchmarks_smoke import NUM, assert_lines, finished, run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("testbed")]


def test_recovery_on_the_slurm_testbed(tmp_path: Path) -> None:
    args = ("--repeats", "1", "--ettr-minutes", "0.25", "--mtbf-s", "5", "--out", str(tmp_path / "out"))
    out = finished(run_benchmark("recovery.py", *args, cwd=tmp_path, timeout=900))
    latency = rf"median\s+{NUM} s  \[{NUM}-{NUM}\] over 1"
    ledger = rf"{NUM}  wall {NUM} s, productive {NUM} s, lost {NUM} s \(startup {NUM}, redone {NUM}, gaps {NUM}\)"
    assert_lines(
        out,  # recovery.md: the restart latencies, the ETTR with faults and without
        rf"in-allocation restart \(SIGKILL\)\s+{latency}",
        rf"requeue \(USR2\)\s+{latency}",
        rf"ETTR faults: {ledger}, attempts \d+",
        rf"ETTR clean : {ledger}, attempts \d+",
        r"kills: \d+ in 0.25 min",
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {"latency_in_allocation_s", "latency_requeue_s", "ettr"} <= results.keys()
