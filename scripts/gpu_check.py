"""One GPU check that fits a device lease: every GPU figure docs/performance.md quotes, from one command.

    scripts/gpu-check.sh --prepare     # here, where the package registry answers: the wheels the GPU image lacks
    scripts/gpu-check.sh OUT           # on the GPU machine (the device tool: carry .whl): this, writing into OUT

The parts, in this order, each within what is left of ``--budget`` seconds (a lease's command may run 10 minutes,
and the check is meant to take at most 7 of them): a part that would start with less than it needs is skipped,
and the JSON and the output say so.

- machine: torch, CUDA, the GPU and its driver, Python, the cores.
- startup: ``import torch`` alone and the first CUDA allocation (each in a fresh interpreter, against an empty
  one), a 1-rank ``python -m hpc_train`` run's start-up phases (its ``StartupProfile``) with hpc_train's own
  part (resolve + process group + model), and ``python -X importtime`` of the worker's imports (the slowest
  top-level packages printed, the whole list in importtime.txt).
- tests: ``pytest -m gpu tests/gpu`` on several workers (gpu-tests.log).
- bench: ``benchmarks/compare.py`` with hpc_train, the compute-only loop and Lightning, ``mlp`` and
  ``transformer``, bf16, 3 repeats, steps 20-120 (bench-results.json, bench.png).
- checkpoint: ``benchmarks/checkpoint_async.py`` on the GPU: training blocked per save, background against
  synchronous, and what the saves add to the run.

Everything lands in OUT/gpu-check.json; with the four files beside it, five in all. Without a GPU the GPU parts
are skipped, saying so (the start-up runs on the CPU). ``--smoke`` runs every part on whatever device there is
at toy sizes: a check of the check, which tests/runs/test_gpu_check.py runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NEEDS_S = {"machine": 5, "startup": 60, "tests": 150, "bench": 240, "checkpoint": 40}
"""What each part needs at least (on an H100 or H200; the GPU tests took 125-206 s there on 4 workers, one
benchmark run 10-20 s): a part is not started with less of the budget left."""


def _python(code: str, timeout: float, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run ``code`` in a fresh interpreter; its wall time from just before the start, and its stdout."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, check=True
    )
    return time.perf_counter() - started, done.stdout


def machine(cuda: bool) -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cores": len(os.sched_getaffinity(0)),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
    }
    if cuda and shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        found["driver"], _, found["gpu_memory"] = smi.partition(", ")
    return found


def startup(out: Path, cuda: bool, budget: float) -> dict[str, Any]:
    """The reference (an empty interpreter, ``import torch``, the first CUDA allocation), a 1-rank run's phases,
    and the worker's import times."""
    empty = statistics.median(_python("pass", 60)[0] for _ in range(3))
    torch_s = statistics.median(_python("import torch", 120)[0] for _ in range(3)) - empty
    # Every torch optimizer imports torch._dynamo when it is built (Optimizer.add_param_group is wrapped by
    # torch._disable_dynamo, which imports it on the first call), the compute-only loop's too: timed on its own.
    code = "import time, torch\nt = time.perf_counter()\nimport torch._dynamo\nprint(time.perf_counter() - t)"
    dynamo_s = statistics.median(float(_python(code, 120)[1]) for _ in range(3))
    first_alloc = None
    if cuda:
        code = (
            "import time, torch\nt = time.perf_counter()\ntorch.zeros(1, device='cuda')\ntorch.cuda.synchronize()\n"
            "print(time.perf_counter() - t)"
        )
        first_alloc = statistics.median(float(_python(code, 120)[1]) for _ in range(3))
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    device = ["cluster.gpus_per_node=1", "trainer.device=cuda"] if cuda else ["trainer.device=cpu"]
    argv = [
        sys.executable,
        "-m",
        "hpc_train",
        f"hydra.run.dir={run_dir}",
        "cluster=local",
        "cluster.tasks_per_node=1",
        *device,
        "trainer.max_steps=5",
        "trainer.max_epochs=0",
        "trainer.val_every_n_epochs=0",
        "trainer.progress_bar=false",
        "trainer.plots=false",
        "trainer.tensorboard=false",
        "data.num_samples=4096",
    ]
    subprocess.run(argv, capture_output=True, text=True, timeout=min(300, budget), check=True)
    from hpc_train.core.records import StartupProfile
    from hpc_train.core.rundir import RunDir

    profile = RunDir(run_dir).startup_profiles()[0]
    phases = {p: getattr(profile, f"{p}_s") for p in StartupProfile.PHASES}
    own = sum(phases[p] or 0.0 for p in StartupProfile.OWN)
    import_phase = (phases["interpreter"] or 0.0) + (phases["imports"] or 0.0)
    reference = empty + torch_s + (first_alloc or 0.0)
    shutil.rmtree(run_dir, ignore_errors=True)
    # What a rank imports up to the end of its "imports" phase (runtime.startup.Startup.device).
    imports = "import hpc_train.runtime.worker, hpc_train.distributed, torch._dynamo"
    times = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", imports],
        capture_output=True,
        text=True,
        timeout=120,
    ).stderr
    (out / "importtime.txt").write_text(times)
    return {
        "empty_interpreter_s": round(empty, 3),
        "import_torch_s": round(torch_s, 3),
        "first_cuda_allocation_s": None if first_alloc is None else round(first_alloc, 3),
        "import_dynamo_s": round(dynamo_s, 3),
        "import_phase_beyond_reference_and_dynamo_s": round(import_phase - reference - dynamo_s, 3),
        "phases_s": {k: None if v is None else round(v, 3) for k, v in phases.items()},
        "own_s": round(own, 3),
        "import_phase_s": round(import_phase, 3),
        "reference_s": round(reference, 3),
        "import_phase_beyond_reference_s": round(import_phase - reference, 3),
        "slowest_imports": slowest_imports(times),
    }


def slowest_imports(importtime: str, count: int = 15) -> list[tuple[str, float]]:
    """Seconds of import per top-level package (``-X importtime``'s own times of each module, summed by the first
    part of its name), the ``count`` largest."""
    found: dict[str, float] = {}
    for line in importtime.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].split(":")[-1].strip().isdigit():
            continue
        root = parts[2].strip().split(".")[0]
        found[root] = found.get(root, 0.0) + int(parts[0].split(":")[-1]) / 1e6
    return sorted(found.items(), key=lambda item: -item[1])[:count]


def tests(out: Path, cuda: bool, budget: float, smoke: bool) -> dict[str, Any]:
    """``pytest -m gpu tests/gpu``: the counts and the time. On a machine without a GPU every test skips."""
    workers = "0" if smoke else str(min(4, max(1, len(os.sched_getaffinity(0)) // 4)))
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider", "-n", workers]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=budget, cwd=REPO)
    seconds = time.perf_counter() - started
    (out / "gpu-tests.log").write_text(done.stdout + done.stderr)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", done.stdout)}
    return {"exit": done.returncode, "seconds": round(seconds, 1), "workers": int(workers), **counts}


def bench(out: Path, cuda: bool, budget: float, smoke: bool) -> dict[str, Any]:
    """benchmarks/compare.py: hpc_train, the compute-only loop and Lightning."""
    if smoke:
        sizes = ["--workloads", "mlp", "--variants", "hpc_train,limit", "--repeats", "1", "--warmup", "10"]
        sizes += ["--steps", "10", "--device", "cuda" if cuda else "cpu"]
    else:
        sizes = ["--workloads", "mlp,transformer", "--variants", "hpc_train,limit,lightning", "--repeats", "3"]
        sizes += ["--warmup", "20", "--steps", "100", "--device", "cuda", "--precision", "bf16"]
    runs = Path(tempfile.mkdtemp(prefix="gpu-check-bench-"))  # its run dirs stay here; two files go to out
    argv = [sys.executable, "benchmarks/compare.py", "--ranks", "1", *sizes, "--timeout", "120", "--out", str(runs)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=budget, cwd=REPO)
    print(done.stdout[-6000:], flush=True)
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr[-3000:]}
    shutil.copy(runs / "results.json", out / "bench-results.json")
    shutil.copy(runs / "bench.png", out / "bench.png")
    result = json.loads((runs / "results.json").read_text())
    return {"exit": 0, "summary": result["summary"], "ratios": result["ratios"], "targets": result["targets"]}


def checkpoint(out: Path, cuda: bool, budget: float, smoke: bool) -> dict[str, Any]:
    """benchmarks/checkpoint_async.py on the device: 84M parameters (1.0 GB with AdamW's moments), a save
    every 6 of 24 steps; toy sizes with --smoke."""
    sizes = ["--width", "512", "--layers", "3", "--steps", "12", "--every", "4"] if smoke else []
    figures = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "checkpoint.json"
    argv = [sys.executable, "benchmarks/checkpoint_async.py", *sizes, "--device", "cuda" if cuda else "cpu"]
    done = subprocess.run([*argv, "--json", str(figures)], capture_output=True, text=True, timeout=budget, cwd=REPO)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        return {"exit": done.returncode, "stderr": done.stderr[-3000:]}
    return {"exit": 0, **json.loads(figures.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where gpu-check.json and the files beside it go")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds for the whole check")
    parser.add_argument("--smoke", action="store_true", help="every part at toy sizes, on whatever device there is")
    args = parser.parse_args(argv)
    import torch

    deadline = time.monotonic() + args.budget
    cuda = torch.cuda.is_available()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"gpu": cuda, "smoke": args.smoke, "budget_s": args.budget, "skipped": {}}
    parts: dict[str, Callable[[float], dict[str, Any]]] = {
        "machine": lambda left: machine(cuda),
        "startup": lambda left: startup(args.out, cuda, left),
        "tests": lambda left: tests(args.out, cuda, left, args.smoke),
        "bench": lambda left: bench(args.out, cuda, left, args.smoke),
        "checkpoint": lambda left: checkpoint(args.out, cuda, left, args.smoke),
    }
    for name, part in parts.items():
        left = deadline - time.monotonic()
        why = None
        if not cuda and not args.smoke and name in ("tests", "bench", "checkpoint"):
            why = "no GPU: torch sees none (--smoke runs it on the CPU at toy sizes)"
        elif not args.smoke and left < NEEDS_S[name]:
            why = f"{left:.0f} s of the budget left, it needs {NEEDS_S[name]} s"
        if why:
            report["skipped"][name] = why
            print(f"gpu-check: {name}: skipped ({why})", flush=True)
            continue
        started = time.monotonic()
        print(f"gpu-check: {name} ...", flush=True)
        try:
            report[name] = part(max(left, 30.0))
        except (subprocess.SubprocessError, OSError, ValueError, KeyError) as error:
            report[name] = {"error": f"{type(error).__name__}: {error}"[-3000:]}
        report[name + "_seconds"] = round(time.monotonic() - started, 1)
        (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))  # what is done, should a part hang
    report["seconds"] = round(args.budget - (deadline - time.monotonic()), 1)
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))
    print_figures(report)
    failed = [n for n in parts if "error" in report.get(n, {}) or report.get(n, {}).get("exit", 0) != 0]
    print(
        f"gpu-check: {'failed: ' + ', '.join(failed) if failed else 'done'} in {report['seconds']} s; "
        f"{args.out / 'gpu-check.json'}"
    )
    return 1 if failed else 0


def print_figures(report: dict[str, Any]) -> None:
    """The figures docs/performance.md quotes, in its words."""
    print("\n==== gpu-check figures ====")
    if "machine" in report:
        print("machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items()))
    s = report.get("startup", {})
    if "phases_s" in s:
        print(
            f"start-up: empty interpreter {s['empty_interpreter_s']} s, import torch +{s['import_torch_s']} s, first "
            f"CUDA allocation {s['first_cuda_allocation_s']} s; the rank's import phase (interpreter + imports) "
            f"{s['import_phase_s']} s, {s['import_phase_beyond_reference_s']:+} s beyond those; hpc_train's own "
            f"{s['own_s']} s"
        )
        print(
            f"  torch._dynamo (which every torch optimizer imports) +{s['import_dynamo_s']} s after torch; the import "
            f"phase beyond torch, CUDA and it: {s['import_phase_beyond_reference_and_dynamo_s']:+} s"
        )
        print("  phases: " + ", ".join(f"{k} {v}" for k, v in s["phases_s"].items() if v is not None))
        print("  slowest imports: " + ", ".join(f"{n} {t:.2f}" for n, t in s["slowest_imports"][:8]))
    t = report.get("tests", {})
    if t:
        print(f"GPU tests: {json.dumps(t)}")
    b = report.get("bench", {})
    for key, value in (b.get("ratios") or {}).items():
        print(f"bench ratio {key}: {value}")
    c = report.get("checkpoint", {})
    if "blocked_median_s" in c:
        print(
            f"checkpoint ({c['device']}, {c['checkpoint_bytes'] / 2**30:.2f} GiB): blocked per save, median: sync "
            f"{c['blocked_median_s']['sync']} s, background {c['blocked_median_s']['async']} s "
            f"({100 * c['async_blocked_share_of_sync']:.1f}% of sync); the run {100 * c['overhead_share_of_run']['sync']:+.1f}% "
            f"with synchronous saves, {100 * c['overhead_share_of_run']['async']:+.1f}% with background ones"
        )
    for name, why in report["skipped"].items():
        print(f"not measured: {name} ({why})")


if __name__ == "__main__":
    sys.exit(main())
