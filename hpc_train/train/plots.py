"""PNG curves of a run's metrics: what rank 0 writes at the end (trainer.plots) and ``hpc_train.plot`` draws.

Each run gets ``plots/loss.png`` (train and validation loss) and ``plots/metrics.png`` (validation metric and
learning rate); ``plot_compare`` overlays one metric of several runs (a sweep's elements).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_train.core.rundir import RunDir, run_labels

__all__ = ["plot_compare", "plot_run", "pyplot", "save"]


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only Agg backend: works without a display, on compute nodes too."""
    # matplotlib (0.5 s) only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib (0.5 s) only when a plot is drawn
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Lay out, write as PNG, and free ``fig``."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def legend_above(ax: Any, *others: Any) -> None:
    """One legend for ``ax`` and its twins, above the plot area: it covers no data and no axis."""
    handles, labels = ax.get_legend_handles_labels()
    for other in others:
        more = other.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=2, frameon=False, fontsize="small")


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if key in r]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write plots/loss.png and plots/metrics.png for one run; returns their paths."""
    rd = RunDir(Path(run_dir))
    rows = rd.read_metrics()
    if not rows:
        raise ValueError(f"{rd.metrics} has no rows yet")
    plt = pyplot()
    out = rd.plots
    out.mkdir(exist_ok=True)

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*_series(rows, "train_loss"), label="train loss (mean over ranks)")
    if any("val_loss" in r for r in rows):
        ax.plot(*_series(rows, "val_loss"), "o-", label="validation loss (exact, all ranks)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    fig.suptitle(rd.path.name, fontsize="medium")
    ax.grid(alpha=0.3)
    legend_above(ax)
    save(fig, out / "loss.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    metric = "val_metric" if any("val_metric" in r for r in rows) else "val_acc"
    if any(metric in r for r in rows):
        ax.plot(*_series(rows, metric), "o-", color="tab:green", label=metric)
        ax.set_ylabel(metric)
    ax.set_xlabel("optimizer step")
    lr_ax = ax.twinx()
    lr_ax.plot(*_series(rows, "lr"), color="tab:gray", alpha=0.6, label="learning rate")
    lr_ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    fig.suptitle(rd.path.name, fontsize="medium")
    legend_above(ax, lr_ax)
    save(fig, out / "metrics.png")
    return [out / "loss.png", out / "metrics.png"]


def plot_compare(run_dirs: list[Path], path: Path, key: str = "val_loss") -> Path:
    """One figure with ``key`` of every run, each labelled by the overrides it does not share with the others."""
    runs = [RunDir(Path(run_dir)) for run_dir in run_dirs]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for rd, label in zip(runs, run_labels(runs), strict=True):
        ax.plot(*_series(rd.read_metrics(), key), "o-", label=label or rd.path.name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    legend_above(ax)
    return save(fig, path)
