"""Side-by-side benchmark: hpc_train against a hand-written DDP loop, Lightning and the pure compute loop.

    python benchmarks/compare.py --repeats 3 --out bench-out

Variants, each launched from scratch as a user would:
  raw        benchmarks/reference_ddp.py under torchrun (the hand-written reference)
  hpc_train  python -m hpc_train with the same model, batch, optimizer and data size (local launch)
  lightning  benchmarks/lightning_ddp.py: Lightning's Trainer with DDP (skipped unless lightning is installed)
  limit      benchmarks/compute_loop.py, one process per rank at once: no DDP, no DataLoader
Runs are interleaved (every variant once per repeat, the order rotated each repeat) so that drift in the
machine's speed hits all variants alike. Each run gives two figures: launch to the end of the first optimizer
step (seconds, from just before the process is started) and steady-state samples/s over steps
warmup..warmup+steps. Prints median [min-max] per configuration and the ratios the targets are stated in;
writes results.json and bench.png to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workloads import LOG_EVERY, WORKLOADS, Workload, measure_marks

from hpc_train.core.records import StartupProfile
from hpc_train.core.rundir import RunDir
from hpc_train.core.textutil import format_table
from hpc_train.tools.jobs import startup_maxima

HERE = Path(__file__).resolve().parent
VARIANTS = ("raw", "hpc_train", "lightning", "limit")


@dataclass(frozen=True)
class Setup:
    """What every run of one benchmark shares."""

    warmup: int
    steps: int
    cores: int
    device: str
    precision: str
    timeout_s: float
    out: Path
    extra: tuple[str, ...] = ()
    """Further overrides for the hpc_train variant only (A/B of an option: trainer.compile=true, ...)."""

    def threads(self, ranks: int) -> int:
        return max(1, self.cores // ranks)

    def common_args(self, workload: Workload, ranks: int) -> list[str]:
        return [
            f"--workload={workload.name}",
            f"--threads={self.threads(ranks)}",
            f"--warmup={self.warmup}",
            f"--steps={self.steps}",
            f"--device={self.device}",
            f"--precision={self.precision}",
        ]


@dataclass(frozen=True)
class Sample:
    workload: str
    ranks: int
    variant: str
    repeat: int
    first_step_s: float
    samples_per_s: float
    phases: tuple[tuple[str, float], ...] = ()
    """hpc_train only: each start-up phase's time on its slowest rank (``jobs status``'s figures), and
    ``own``, the rank whose hpc_train part took longest."""


PHASES = (*StartupProfile.PHASES, "own")


def commands(variant: str, workload: Workload, ranks: int, setup: Setup, run_dir: Path) -> list[list[str]]:
    """The command line(s) one run starts: several for ``limit`` (one process per rank, run together)."""
    py = sys.executable
    common = setup.common_args(workload, ranks)
    if variant == "raw":
        launcher = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        return [[*launcher, str(HERE / "reference_ddp.py"), *common]]
    if variant == "lightning":
        return [[py, str(HERE / "lightning_ddp.py"), f"--ranks={ranks}", *common]]
    if variant == "limit":
        return [[py, str(HERE / "compute_loop.py"), f"--seed={r}", *common] for r in range(ranks)]
    if variant == "hpc_train":
        return [[py, "-m", "hpc_train", *hpc_train_overrides(workload, ranks, setup, run_dir)]]
    raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")


def hpc_train_overrides(workload: Workload, ranks: int, setup: Setup, run_dir: Path) -> list[str]:
    """The same job as the reference: same model, batch, AdamW lr 1e-3, data size, logging interval, threads.

    Validation, TensorBoard and plots are off because the reference does none of them (they cost nothing in
    the window anyway: validation is skipped, plots are drawn after training).
    """
    end = setup.warmup + setup.steps
    return [
        f"hydra.run.dir={run_dir}",
        "cluster=local",
        f"cluster.tasks_per_node={ranks}",
        f"cluster.gpus_per_node={ranks if setup.device == 'cuda' else 0}",  # 0 hides the GPUs from the ranks
        f"cluster.cpus_per_task={setup.threads(ranks)}",
        *workload.hpc_train_overrides,
        "optim=adamw",
        f"trainer.batch_size={workload.batch_size}",
        "trainer.lr=1e-3",
        f"trainer.max_steps={end}",
        "trainer.max_epochs=0",
        f"trainer.log_every_n_steps={LOG_EVERY}",
        f"trainer.device={setup.device}",
        f"trainer.precision={setup.precision}",
        "trainer.val_every_n_epochs=0",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
        "trainer.plots=false",
        f"data.num_samples={workload.samples_needed(end, ranks)}",
        "data.val_fraction=0",
        *setup.extra,
    ]


def parse_reports(stdout: str) -> list[dict[str, float]]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines() if line.startswith("BENCH_RESULT ")]


def hpc_train_report(run_dir: Path, setup: Setup, global_batch: int) -> dict[str, float]:
    """The reference's figures, read from the run's metrics.jsonl: rows end exactly at the window's marks."""
    start, end = measure_marks(setup.warmup, setup.steps)
    rows = {row["step"]: row for row in RunDir(run_dir).read_metrics()}
    if start not in rows or end not in rows:
        raise RuntimeError(f"{RunDir(run_dir).metrics} lacks the rows for steps {start} and {end}")
    first = rows[min(rows)]
    return {
        "first_step_unix": first["first_step_at"],
        "window_s": rows[end]["time_s"] - rows[start]["time_s"],
        "window_samples": (end - start) * global_batch,
    }


def run_once(variant: str, workload: Workload, ranks: int, setup: Setup, repeat: int) -> Sample:
    """Start the variant, wait for it (never longer than the timeout), and turn its report into a Sample."""
    run_dir = setup.out / "runs" / f"{workload.name}-{ranks}r-{variant}-{repeat}"
    log_path = run_dir.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.time()
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for cmd in commands(variant, workload, ranks, setup, run_dir)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, setup.timeout_s - (time.time() - start)))[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        raise RuntimeError(f"{variant} {workload.name} x{ranks} ran past {setup.timeout_s:.0f} s") from None
    finally:
        log_path.write_text("".join(outputs))
    failed = [p.returncode for p in procs if p.returncode != 0]
    if failed:
        raise RuntimeError(f"{variant} {workload.name} x{ranks} exited with {failed}; output in {log_path}")
    if variant == "hpc_train":
        reports = [hpc_train_report(run_dir, setup, workload.batch_size * ranks)]
    else:
        reports = [r for out in outputs for r in parse_reports(out)]
    if not reports:
        raise RuntimeError(f"{variant} printed no BENCH_RESULT line; output in {log_path}")
    maxima = startup_maxima(RunDir(run_dir)) if variant == "hpc_train" else {}
    return Sample(
        workload.name,
        ranks,
        variant,
        repeat,
        first_step_s=max(r["first_step_unix"] for r in reports) - start,
        samples_per_s=sum(r["window_samples"] / r["window_s"] for r in reports),
        phases=tuple((phase, seconds) for phase, (seconds, _) in maxima.items()),
    )


def schedule(variants: Sequence[str], workloads: Sequence[str], ranks: Sequence[int], repeats: int) -> list[Any]:
    """(repeat, workload, ranks, variant) in run order: interleaved, the variant order rotated per repeat."""
    order = []
    for repeat in range(repeats):
        shift = repeat % len(variants)
        rotated = [*variants[shift:], *variants[:shift]]
        order += [(repeat, w, r, v) for w in workloads for r in ranks for v in rotated]
    return order


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Per 'workload/ranks/variant': median and range of both figures."""
    keys = sorted({(s.workload, s.ranks, s.variant) for s in samples})
    out = {}
    for w, r, v in keys:
        mine = [s for s in samples if (s.workload, s.ranks, s.variant) == (w, r, v)]
        out[f"{w}/{r}/{v}"] = {
            "samples_per_s": spread([s.samples_per_s for s in mine]),
            "first_step_s": spread([s.first_step_s for s in mine]),
        }
    return out


def phase_table(samples: list[Sample]) -> list[list[Any]]:
    """Per hpc_train configuration: each start-up phase's median (over repeats) on its slowest rank."""
    rows = []
    for w, r in sorted({(s.workload, s.ranks) for s in samples if s.phases}):
        mine = [dict(s.phases) for s in samples if (s.workload, s.ranks) == (w, r) and s.phases]
        cells = [
            statistics.median([p[phase] for p in mine if phase in p]) if any(phase in p for p in mine) else None
            for phase in PHASES
        ]
        rows.append([w, r, *("-" if c is None else f"{c:.2f}" for c in cells)])
    return rows


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per 'workload/ranks': hpc_train's medians over raw's, Lightning's and the limit's."""
    out: dict[str, dict[str, float]] = {}
    for key, figures in summary.items():
        w, r, v = key.split("/")
        if v != "hpc_train":
            continue
        mine = out.setdefault(f"{w}/{r}", {})
        for other in ("raw", "lightning", "limit"):
            theirs = summary.get(f"{w}/{r}/{other}")
            if theirs is None:
                continue
            mine[f"throughput_vs_{other}"] = figures["samples_per_s"]["median"] / theirs["samples_per_s"]["median"]
            mine[f"first_step_vs_{other}"] = figures["first_step_s"]["median"] / theirs["first_step_s"]["median"]
    return out


def targets(ratio: dict[str, dict[str, float]]) -> list[tuple[str, str, float, bool]]:
    """The issue's targets: (what, where, measured ratio, met)."""
    checks = [
        ("throughput >= 0.99x raw at 2 ranks", "throughput_vs_raw", 2, lambda x: x >= 0.99),
        ("throughput >= Lightning at 2 ranks", "throughput_vs_lightning", 2, lambda x: x >= 1.0),
        ("first step <= 0.5x Lightning at 2 ranks", "first_step_vs_lightning", 2, lambda x: x <= 0.5),
        ("first step < torchrun script at 2 ranks", "first_step_vs_raw", 2, lambda x: x < 1.0),
        ("1-rank step time <= 1.10x compute loop", "throughput_vs_limit", 1, lambda x: 1 / x <= 1.10),
    ]
    out = []
    for what, key, ranks, met in checks:
        for where, figures in sorted(ratio.items()):
            if where.endswith(f"/{ranks}") and key in figures:
                out.append((what, where, figures[key], bool(met(figures[key]))))
    return out


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    import torch

    info = {"cpu": model, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version()}
    info |= {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    if importlib.util.find_spec("lightning"):
        import lightning

        info["lightning"] = lightning.__version__
    return info


def print_report(summary: dict[str, dict[str, Any]], ratio: dict[str, dict[str, float]]) -> None:
    def cell(f: dict[str, float], fmt: str) -> str:
        return f"{f['median']:{fmt}} [{f['min']:{fmt}}-{f['max']:{fmt}}]"

    rows = [
        [*key.split("/"), cell(f["samples_per_s"], ".0f"), cell(f["first_step_s"], ".2f"), f["samples_per_s"]["n"]]
        for key, f in summary.items()
    ]
    print(format_table(["workload", "ranks", "variant", "samples/s median [min-max]", "first step s", "n"], rows))
    print()
    names = sorted({k for r in ratio.values() for k in r})
    print(
        format_table(
            ["workload/ranks", *names],
            [[w, *(f"{r.get(n, float('nan')):.3f}" for n in names)] for w, r in sorted(ratio.items())],
        )
    )
    print()
    for what, where, value, met in targets(ratio):
        print(f"{'MET ' if met else 'MISS'}  {what:44s} {where:8s} {value:.3f}")


def plot(summary: dict[str, dict[str, Any]], path: Path) -> None:
    from hpc_train.train.plots import pyplot, save

    configs = sorted({key.rsplit("/", 1)[0] for key in summary})
    variants = [v for v in VARIANTS if any(k.endswith("/" + v) for k in summary)]
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        for ax, figure in zip(axes, ("samples_per_s", "first_step_s"), strict=True):
            xs, med, low, high = [], [], [], []
            for j, config in enumerate(configs):
                f = summary.get(f"{config}/{variant}")
                if f is None:
                    continue
                s = f[figure]
                xs.append(j + i * width)
                med.append(s["median"])
                low.append(s["median"] - s["min"])
                high.append(s["max"] - s["median"])
            ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=variant)
    labels = [c.replace("/", " x") + "r" for c in configs]
    for ax, title in zip(
        axes, ("steady-state samples/s (higher is better)", "launch to first optimizer step, s"), strict=True
    ):
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(configs))], labels)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp,cnn", help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help=f"steps before the window (multiple of {LOG_EVERY})")
    parser.add_argument("--steps", type=int, default=40, help=f"steps in the window (multiple of {LOG_EVERY})")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="ranks x threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--hpc-train-extra", nargs="*", default=[], help="more overrides for hpc_train only, e.g. trainer.compile=true"
    )
    args = parser.parse_args(argv)
    try:
        workloads = [WORKLOADS[w] for w in args.workloads.split(",")]
    except KeyError as e:
        parser.error(f"--workloads: unknown workload {e}; valid: {', '.join(WORKLOADS)}")
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    if "lightning" in variants and importlib.util.find_spec("lightning") is None:
        print("lightning is not installed (pip install -e .[bench]): skipping the lightning variant", file=sys.stderr)
        variants.remove("lightning")
    try:
        measure_marks(args.warmup, args.steps)
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError as e:
        parser.error(str(e))
    setup = Setup(
        args.warmup,
        args.steps,
        args.cores,
        args.device,
        args.precision,
        args.timeout,
        args.out,
        tuple(args.hpc_train_extra),
    )
    by_name = {w.name: w for w in workloads}
    samples = []
    order = schedule(variants, list(by_name), ranks, args.repeats)
    for n, (repeat, w, r, v) in enumerate(order, start=1):
        sample = run_once(v, by_name[w], r, setup, repeat)
        print(
            f"[{n}/{len(order)}] {w} x{r} {v:9s} {sample.samples_per_s:8.0f} samples/s, "
            f"first step {sample.first_step_s:.2f} s"
            + (f" (hpc_train's own {dict(sample.phases)['own']:.2f} s)" if sample.phases else ""),
            flush=True,
        )
        samples.append(sample)
    summary = summarize(samples)
    ratio = ratios(summary)
    print()
    print_report(summary, ratio)
    phases = phase_table(samples)
    if phases:
        print("\nhpc_train's start-up, s: each phase on its slowest rank (median over repeats); own = resolve +")
        print("process group + model, the part that is hpc_train's and not the imports' or the other ranks' wait")
        print(format_table(["workload", "ranks", *(p.replace("_", " ") for p in PHASES)], phases))
    result = {
        "machine": machine(),
        "setup": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(setup).items()},
        "samples": [asdict(s) for s in samples],
        "summary": summary,
        "ratios": ratio,
        "targets": [{"target": t, "where": w, "ratio": x, "met": m} for t, w, x, m in targets(ratio)],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    plot(summary, args.out / "bench.png")
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
