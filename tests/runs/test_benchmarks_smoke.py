"""Every script of benchmarks/ at its smallest size, run as a user runs it (its own process, a timeout on every
wait), to its end, printing the figures the manual quotes from it: docs/performance.md (compare.py and the
variants it starts, trace_summary.py), docs/scale.md (scale.py, checkpoint_async.py --ranks, compare.py's
start-up phases), docs/checkpoints.md (checkpoint_verify.py, checkpoint_async.py), docs/mirror.md (mirror.py),
docs/stragglers-and-timeouts.md (stragglers.py); docs/recovery.md's recovery.py runs on the Slurm testbed, in
tests/integration/test_benchmarks_slurm.py.

The lines and their labels are checked, not the values: a few steps on shared cores measure nothing. Nothing
else runs these scripts, and they drifted from the package unseen (scale.py still handed RunDir.write_rank_table
dicts after it came to take typed rows)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.slow

BENCHMARKS = REPO / "benchmarks"
NUM = r"[-+]?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)"
"""A printed figure, whatever its value (a tiny run's differences can be negative)."""


def run_benchmark(
    script: str, *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<script> ARGS`` in ``cwd``, waited for at most ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def finished(proc: subprocess.CompletedProcess[str], status: int = 0) -> str:
    """The benchmark's stdout, once it is known to have exited with ``status``."""
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def assert_lines(out: str, *patterns: str) -> None:
    """Each pattern matches a whole line of ``out``."""
    missing = [p for p in patterns if not re.search(f"^{p}$", out, re.MULTILINE)]
    assert not missing, f"no line matches {missing} in:\n{out}"


SCALE_FIGURES = (
    "resolve_ms_per_rank",  # scale.md: rank resolution, per rank
    "rendezvous_s",  # scale.md: "The rendezvous took 1-10 s at every N"
    "heartbeats_per_node_per_10s",  # heartbeats per node per 10 s that used to be files
    "status_writes_per_node_per_10s",  # status/ file updates per node per 10 s
    "supervisor_read_s",  # the supervisor reads every status and classifies a failure (seconds, MB)
    "supervisor_peak_mb",
    "teardown_s",  # one rank fails, every other rank ends and says so
    "jobs_status_s",  # `jobs status`
    "rank_table_log_lines",  # rank 0's log lines for the rank table
    "rank_table_write_s",
    "goodput_s",
    "sbatch_bytes",  # the sbatch script
)


def test_scale_prints_each_figure_and_its_growth(tmp_path: Path) -> None:
    # 4 and 8 nodes: more than 8 ranks, so rank 0's rank table is the summary the page quotes, not every row.
    # Summaries every 0.5 s, so that the 1.5 s of steady training has status/ writes to count. RES_OPTIONS, as
    # the script's help says: a nameserver that drops a burst of lookups would hold each rendezvous 5-10 s.
    proc = run_benchmark(
        "scale.py",
        *("--nodes", "4", "8", "--seconds", "1.5", "--every-s", "0.5", "--out", "out"),
        cwd=tmp_path,
        env={"RES_OPTIONS": "timeout:1 attempts:1"},
    )
    # Its exit status is its verdict: 1 where a figure grows faster than expected, which the noise of two small
    # N may well make happen; the verdict is printed either way.
    flagged = re.findall(r"^FLAG: (\w+) grows like N\^\S+ \(expected at most N\^\S+\)$", proc.stdout, re.MULTILINE)
    out = finished(proc, 1 if flagged else 0)
    if not flagged:
        assert_lines(out, "no figure grows faster than expected")
    for nodes, ranks in ((4, 16), (8, 32)):
        assert_lines(
            out,
            rf"{nodes} nodes x 4 ranks:",
            rf"  {nodes} nodes: resolved {ranks} ranks, {NUM} ms each",
            rf"  {nodes} nodes: rendezvous {NUM}s",
            rf"  {nodes} nodes: {NUM} status/ writes per node per 10 s \({NUM} heartbeats\)",
        )
    assert_lines(out, r"figure\s+N=4 \(16 ranks\)\s+N=8 \(32 ranks\)\s+growth")
    assert_lines(out, *(rf"{key}\s+{NUM}\s+{NUM}\s+{NUM} \(expected {NUM}\)" for key in SCALE_FIGURES))
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["nodes"] for r in results] == [4, 8] and all(set(SCALE_FIGURES) <= r.keys() for r in results)
    # None counted would mean the benchmark's counter no longer sees how the nodes write their summaries.
    assert all(r["status_writes_per_node_per_10s"] > 0 for r in results), results


VARIANTS = ("raw", "hpc_train", "lightning", "limit")
LIGHTNING = importlib.util.find_spec("lightning") is not None
"""compare.py runs Lightning's variant where lightning is installed (the test and bench extras install it)."""


@dataclass(frozen=True)
class Compared:
    proc: subprocess.CompletedProcess[str]
    out: Path


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Compared:
    """One compare.py run at its smallest: the mlp, 1 rank, every variant once, a window of 10 steps. Its
    hpc_train run profiles 2 steps (an option A/B as docs/performance.md runs them), for trace_summary.py."""
    out = tmp_path_factory.mktemp("compare")
    options = ("--workloads", "mlp", "--ranks", "1", "--repeats", "1", "--warmup", "10", "--steps", "10")
    extra = ("--timeout", "120", "--out", str(out), "--hpc-train-extra", "trainer.profile_steps=2")
    return Compared(run_benchmark("compare.py", *options, *extra, cwd=out, timeout=300), out)


def test_compare_runs_every_variant_and_prints_its_tables(compared: Compared) -> None:
    out = finished(compared.proc)
    variants = [v for v in VARIANTS if v != "lightning" or LIGHTNING]
    if not LIGHTNING:
        assert "skipping the lightning variant" in compared.proc.stderr
    ran = re.findall(rf"^\[\d/{len(variants)}\] mlp x1 (\w+)\s+{NUM} samples/s, first step {NUM} s", out, re.M)
    assert sorted(ran) == sorted(variants), out
    cell = rf"{NUM} \[{NUM}-{NUM}\]"
    assert_lines(out, r"workload\s+ranks\s+variant\s+samples/s median \[min-max\]\s+first step s\s+n")
    assert_lines(out, *(rf"mlp\s+1\s+{v}\s+{cell}\s+{cell}\s+1" for v in variants))
    # performance.md quotes hpc_train's throughput and first step against each of the others.
    ratios = [f"{figure}_vs_{v}" for figure in ("first_step", "throughput") for v in variants if v != "hpc_train"]
    assert_lines(out, r"workload/ranks\s+" + r"\s+".join(sorted(ratios)), rf"mlp/1(\s+{NUM}){{{len(ratios)}}}")
    assert_lines(out, rf"(MET |MISS)  1-rank step time <= 1.10x compute loop\s+mlp/1\s+{NUM}")
    # scale.md quotes the start-up phases of hpc_train's slowest rank, and "own" (hpc_train's part).
    assert_lines(out, r"hpc_train's start-up, s: each phase on its slowest rank .*")
    assert_lines(out, r"workload\s+ranks\s+interpreter\s+resolve\s+imports\s+rendezvous\s+.*\s+own")
    where = re.escape(str(compared.out))
    assert_lines(out, rf"wrote {where}/results.json and {where}/bench.png")
    results = json.loads((compared.out / "results.json").read_text())
    assert sorted(s["variant"] for s in results["samples"]) == sorted(variants)
    assert (compared.out / "bench.png").stat().st_size > 0


def test_trace_summary_reads_the_trace_of_a_profiled_run(compared: Compared, tmp_path: Path) -> None:
    finished(compared.proc)
    traces = sorted((compared.out / "runs" / "mlp-1r-hpc_train-0" / "profile").glob("*.pt.trace.json"))
    assert traces, "trainer.profile_steps=2 wrote no trace"
    out = finished(run_benchmark("trace_summary.py", *map(str, traces), cwd=tmp_path, timeout=60))
    # The 2 profiled steps: the ProfilerStep spans it counts are still named as it expects.
    assert_lines(out, rf"== {re.escape(traces[0].name)}: 2 steps, {NUM} ms a step \(host\), GPU busy {NUM}%")
    assert_lines(out, rf"   kernels/step {NUM}; host syncs/step {NUM}", r"   runtime calls/step: .*")
    assert_lines(out, r"   top kernels, ms/step:", r"   top host ops \(inclusive\), ms/step:")
    assert_lines(out, rf"\s+{NUM}  aten::\S+")  # on a CPU, the host's operators are the time


def test_checkpoint_async_in_process(tmp_path: Path) -> None:
    args = ("--width", "64", "--layers", "2", "--steps", "4", "--every", "2", "--dir", str(tmp_path))
    out = finished(run_benchmark("checkpoint_async.py", *args, cwd=tmp_path))
    blocked = rf"training blocked per checkpoint: median {NUM} s, max {NUM} s; the write itself: median {NUM} s"
    assert_lines(
        out,  # checkpoints.md's table: blocked per checkpoint (median, max), the write itself, total run time
        rf"{NUM}M parameters on cpu, 4 steps, a checkpoint every 2; torch threads: \d+",
        rf" none: total {NUM} s",
        rf" sync: total {NUM} s; checkpoint {NUM} GiB; {blocked}",
        rf"async: total {NUM} s; checkpoint {NUM} GiB; {blocked}",
        rf"blocking: background {NUM} s = {NUM}% of a synchronous save \({NUM} s\); checkpoint overhead on the "
        rf"run: sync {NUM} s, background {NUM} s",
    )


def test_checkpoint_async_through_hpc_train(tmp_path: Path) -> None:
    args = ("--ranks", "1", "--width", "32", "--layers", "1", "--steps", "4", "--every", "2", "--dir", str(tmp_path))
    out = finished(run_benchmark("checkpoint_async.py", *args, cwd=tmp_path, timeout=300))
    share = rf"\(({NUM}|n/a) of synchronous\)"
    assert_lines(
        out,  # scale.md: what synchronous and background saves add to the fit, and the share
        r"1 ranks \(python -m hpc_train\), 4 steps, a checkpoint every 2",
        rf" none: total {NUM} s \(training {NUM} s\)",
        rf" sync: total {NUM} s \(training {NUM} s\); checkpoint {NUM} GiB",
        # Blocked and write seconds come from rank 0's log lines: their wording is what this reads.
        rf"async: total {NUM} s \(training {NUM} s\); checkpoint {NUM} GiB; training blocked per checkpoint: "
        rf"median {NUM} s, max {NUM} s; the write itself: median {NUM} s",
        rf"launch to exit: checkpoints add {NUM} s synchronous, {NUM} s in the background {share} to a {NUM} s run",
        rf"training alone: {NUM} s synchronous, {NUM} s in the background {share} on {NUM} s",
    )


def test_checkpoint_verify(tmp_path: Path) -> None:
    out = finished(
        run_benchmark("checkpoint_verify.py", "--mb", "1", "--repeats", "1", "--dir", str(tmp_path), cwd=tmp_path)
    )
    assert_lines(
        out,  # checkpoints.md: a save with digest and ledger against a plain one, a verified load against a plain one
        rf"checkpoint of 1 MiB \({NUM} MiB on disk\), median of 1, in {re.escape(str(tmp_path))}:",
        rf"  save: plain atomic {NUM} s, with SHA-256 and ledger {NUM} s \({NUM}%\)",
        rf"  load: plain {NUM} s, verified \(digest, load, finite\) {NUM} s \({NUM}%; {NUM} MiB/s for the checks\)",
    )


def test_stragglers(tmp_path: Path) -> None:
    args = ("--workloads", "mlp", "--steps", "2", "--tiny-steps", "40", "--repeats", "1", "--gathers", "5")
    out = finished(run_benchmark("stragglers.py", *args, "--tensors", "10", cwd=tmp_path))
    assert_lines(
        out,  # stragglers-and-timeouts.md: the clock per step and per tensor, the gather and its share of a step
        rf"exchange: one gather of 2 ranks over gloo, median {NUM} us",
        rf"mlp\s+step\s+{NUM} ms, \d+ parameter tensors; the clock\s+{NUM} us a step \({NUM}%\); the exchange "
        rf"every 60 s {NUM} us a step \({NUM}%\)",
        rf"10 parameter tensors: the clock\s+{NUM} us a step",
    )


def test_mirror_to_a_second_local_path(tmp_path: Path) -> None:
    # A second local path: one of the two stores docs/mirror.md measures, with nothing to start. (The S3 one
    # differs only in the URL; tests/runs/test_mirror.py runs the mirror itself against SeaweedFS.)
    # No warm-up run (--warm-ups 0): it would be one more run without the mirror, 5 s of the module's 2 minutes.
    mirror = tmp_path / "mirror"
    args = ("--url", str(mirror), "--steps", "4", "--every", "2", "--width", "32", "--layers", "1", "--repeats", "1")
    out = finished(
        run_benchmark("mirror.py", *args, "--warm-ups", "0", "--dir", str(tmp_path), cwd=tmp_path, timeout=300)
    )
    assert "warm-up" not in out
    assert_lines(
        out,  # mirror.md: run time without and with, the difference, the end's wait for the last copy
        rf"  none:\s+{NUM} s from launch to exit",
        # A number, not "?": rank 0's log still says when the last copy landed, in the words this reads.
        rf"mirror:\s+{NUM} s from launch to exit; checkpoint {NUM} MB, the last copy took {NUM} s, the end waited "
        rf"{NUM} s for it",
        rf"median: without {NUM} s, with the mirror {NUM} s: {NUM} s \({NUM}%\) for 2 checkpoints to "
        + re.escape(str(mirror)),
    )
