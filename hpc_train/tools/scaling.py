"""``python -m hpc_train.scaling``: run one job at several world sizes and say how far it scales.

    python -m hpc_train.scaling --world-sizes 1,2,4 --out scaling/ -- trainer.max_steps=200
    python -m hpc_train.scaling --world-sizes 1,2,4 --tasks-per-node 2 --mode both -- cluster=slurm

Strong scaling keeps the global batch (and so the problem) fixed and splits it over more ranks; weak scaling
keeps the per-rank batch fixed, so the global batch grows with the ranks. Each point is an ordinary run
(local, or a Slurm job: all points are submitted at once, then awaited). Throughput is the median of the
samples/s a run logged after its first row (start-up and warm-up excluded). The table gives speed-up and
efficiency against the smallest world size, and the recommendation is the largest world size whose
efficiency stays at or above ``--threshold``. With ``--mode both``, the smallest world size is one run for both
modes (the same ranks, batch and data).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_train.core.errors import ConfigError, ExitCode, LaunchError
from hpc_train.core.records import ScalingPoint, ScalingStudy
from hpc_train.core.textutil import format_table
from hpc_train.tools.api import Run, compose_config, submit
from hpc_train.train.plots import pyplot, save

__all__ = ["Point", "main", "plan", "recommend", "summarize"]


@dataclass(frozen=True)
class Point:
    """One run of the study."""

    mode: str
    world_size: int
    nodes: int
    tasks_per_node: int
    batch_size: int
    data_size: int | None = None

    @property
    def name(self) -> str:
        data = f"-n{self.data_size}" if self.data_size else ""
        return f"{self.mode}-w{self.world_size}{data}"

    def overrides(self) -> list[str]:
        shape = [f"cluster.nodes={self.nodes}", f"cluster.tasks_per_node={self.tasks_per_node}"]
        data = [f"data.num_samples={self.data_size}"] if self.data_size else []
        return [*shape, f"trainer.batch_size={self.batch_size}", *data]


def plan(
    world_sizes: list[int], tasks_per_node: int, base_batch: int, modes: list[str], data_sizes: list[int | None]
) -> list[Point]:
    """The runs of a study. Strong: global batch = base_batch x smallest world size, split evenly."""
    smallest = min(world_sizes)
    points = []
    for mode in modes:
        for data_size in data_sizes:
            for world in world_sizes:
                per_node = min(world, tasks_per_node)
                if world % per_node:
                    raise ConfigError(
                        f"--world-sizes: {world} ranks do not fill nodes of {per_node} tasks evenly. HINT: use "
                        "multiples of --tasks-per-node above it."
                    )
                if mode == "strong":
                    global_batch = base_batch * smallest
                    if global_batch % world:
                        raise ConfigError(
                            f"strong scaling splits a global batch of {global_batch} over {world} ranks unevenly. "
                            "HINT: pick a trainer.batch_size that the world sizes divide."
                        )
                    batch = global_batch // world
                else:
                    batch = base_batch
                points.append(Point(mode, world, world // per_node, per_node, batch, data_size))
    return points


def throughput(rows: list[dict[str, Any]]) -> float:
    """Median samples/s of a run's rows, the first (start-up, warm-up) left out when there are others."""
    values = [r["samples_per_s"] for r in rows if "samples_per_s" in r]
    if not values:
        raise LaunchError("the run logged no samples_per_s (was trainer.log_every_n_steps larger than max_steps?)")
    return float(statistics.median(values[1:] if len(values) > 1 else values))


def summarize(points: list[Point], throughputs: list[float]) -> list[ScalingPoint]:
    """Speed-up and efficiency of each point against the smallest world size of its mode and data size."""
    table = []
    for point, value in zip(points, throughputs, strict=True):
        base_point, base_value = min(
            (
                (p, v)
                for p, v in zip(points, throughputs, strict=True)
                if (p.mode, p.data_size) == (point.mode, point.data_size)
            ),
            key=lambda pv: pv[0].world_size,
        )
        speedup = value / base_value
        efficiency = speedup / (point.world_size / base_point.world_size)
        table.append(
            ScalingPoint(
                mode=point.mode,
                world_size=point.world_size,
                nodes=point.nodes,
                tasks_per_node=point.tasks_per_node,
                batch_size=point.batch_size,
                data_size=point.data_size,
                samples_per_s=value,
                speedup=speedup,
                efficiency=efficiency,
            )
        )
    return table


def recommend(table: Sequence[ScalingPoint], threshold: float) -> dict[str, int]:
    """Per mode: the largest world size whose efficiency is at least ``threshold`` (every data size agreeing)."""
    best: dict[str, int] = {}
    for mode in sorted({row.mode for row in table}):
        rows = [r for r in table if r.mode == mode]
        worlds = sorted({r.world_size for r in rows})
        ok = [w for w in worlds if all((r.efficiency or 0.0) >= threshold for r in rows if r.world_size == w)]
        best[mode] = max(ok) if ok else min(worlds)
    return best


def _plot(table: Sequence[ScalingPoint], path: Path, threshold: float) -> None:

    fig, (ax_t, ax_e) = pyplot().subplots(1, 2, figsize=(10, 4))
    for key in sorted({(r.mode, r.data_size) for r in table}, key=str):
        rows = sorted((r for r in table if (r.mode, r.data_size) == key), key=lambda r: r.world_size)
        label = key[0] + (f", n={key[1]}" if key[1] else "")
        worlds = [r.world_size for r in rows]
        ax_t.plot(worlds, [r.samples_per_s for r in rows], "o-", label=label)
        ax_e.plot(worlds, [r.efficiency for r in rows], "o-", label=label)
    ax_e.axhline(threshold, color="tab:red", linestyle="--", label=f"threshold {threshold:g}")
    worlds = sorted({r.world_size for r in table})
    for ax, title in ((ax_t, "throughput (samples/s)"), (ax_e, "efficiency")):
        ax.set_xticks(worlds)  # ranks are whole numbers
        ax.set_xlabel("world size (ranks)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    save(fig, path)


def run_study(points: list[Point], overrides: list[str], out: Path, timeout_s: float) -> list[float]:
    """Submit every point (local runs go one at a time, so they do not share the CPUs), then collect.

    Points that are the same run share it: with ``--mode both``, strong and weak scaling at the smallest world
    size have the same ranks, batch and data, so that job runs once (in the strong point's folder) and both rows
    of the table read its throughput."""
    base = compose_config(*overrides)
    runs: dict[tuple[str, ...], Run] = {}
    for point in points:
        key = tuple(point.overrides())
        if key in runs:
            continue
        runs[key] = submit(*overrides, *key, run_dir=out / point.name)
        if base.cluster.launcher != "slurm":
            _finish(runs[key], timeout_s)
    values = {key: throughput(_finish(run, timeout_s)) for key, run in runs.items()}
    return [values[tuple(point.overrides())] for point in points]


def _finish(run: Run, timeout_s: float) -> list[dict[str, Any]]:
    run.result(timeout=timeout_s)
    return run.metrics()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.scaling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world-sizes", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    parser.add_argument(
        "--tasks-per-node",
        type=int,
        default=0,
        help="ranks per node before a point spans several nodes (default: the config's)",
    )
    parser.add_argument("--mode", choices=("strong", "weak", "both"), default="strong")
    parser.add_argument(
        "--data-sizes", default="", help="comma-separated data.num_samples values to repeat the study at"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.7, help="efficiency the recommendation must keep (default 0.7)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("scaling"), help="folder for the runs, scaling.json and scaling.png"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for each run")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (after --)")
    args = parser.parse_args(argv)
    try:
        worlds = sorted({int(w) for w in args.world_sizes.split(",")})
        data_sizes: list[int | None] = [int(n) for n in args.data_sizes.split(",") if n] or [None]
        base = compose_config(*args.overrides)
        per_node = args.tasks_per_node or (
            base.cluster.tasks_per_node if base.cluster.launcher == "slurm" else max(worlds)
        )
        modes = ["strong", "weak"] if args.mode == "both" else [args.mode]
        points = plan(worlds, per_node, base.trainer.batch_size, modes, data_sizes)
        for point in points:  # every point's config is valid before the first one runs
            compose_config(*args.overrides, *point.overrides())
    except (ConfigError, ValueError) as exc:
        print(f"hpc_train.scaling: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        values = run_study(points, args.overrides, args.out.resolve(), args.timeout)
    except LaunchError as exc:
        print(f"hpc_train.scaling: a run failed, no table: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    table = summarize(points, values)
    best = recommend(table, args.threshold)
    study = ScalingStudy(points=tuple(table), threshold=args.threshold, recommended=best)
    (args.out / "scaling.json").write_text(json.dumps(study.to_json(), indent=1))
    _plot(table, args.out / "scaling.png", args.threshold)
    header = ["mode", "data", "ranks", "nodes x tasks", "batch/rank", "samples/s", "speed-up", "efficiency"]
    rows = [
        [
            r.mode,
            r.data_size or "-",
            r.world_size,
            f"{r.nodes}x{r.tasks_per_node}",
            r.batch_size,
            f"{r.samples_per_s:.0f}",
            f"{r.speedup or 0.0:.2f}",
            f"{r.efficiency or 0.0:.2f}",
        ]
        for r in table
    ]
    print(format_table(header, rows))
    for mode, world in best.items():
        print(f"recommended ({mode} scaling, efficiency >= {args.threshold:g}): {world} ranks")
    print(f"wrote {args.out / 'scaling.json'} and {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
