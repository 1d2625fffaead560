"""``python -m hpc_train.plot RUN_DIR [RUN_DIR ...]``: PNG curves of metrics.jsonl.

Each run gets ``plots/loss.png`` (train and validation loss) and ``plots/metrics.png`` (validation metric and
learning rate). With several runs (a sweep's elements) ``--compare OUT.png`` overlays their validation loss,
each run labelled by the overrides that set it apart. ``--timeline`` draws instead where a Slurm run's time
went (``plots/timeline.png``): its allocations and attempts on one time axis, with start-up, productive
training, redone work, restart gaps, queue waits, checkpoints, stop signals, failures and the ETTR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpc_train.core.errors import ExitCode
from hpc_train.core.rundir import RunDir
from hpc_train.tools.timeline import plot_timeline
from hpc_train.train.plots import plot_compare, plot_run, pyplot, save

__all__ = ["main", "plot_compare", "plot_run", "pyplot", "save"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--compare", type=Path, help="also overlay the runs' validation loss in this PNG")
    parser.add_argument("--timeline", action="store_true", help="draw each run's allocations and attempts instead")
    args = parser.parse_args(argv)
    if args.timeline:
        for run_dir in args.run_dirs:
            try:
                print(plot_timeline(run_dir))
            except ValueError as exc:
                print(f"hpc_train.plot: {exc}", file=sys.stderr)
                return ExitCode.USAGE
        return 0
    for run_dir in args.run_dirs:
        metrics = RunDir(run_dir).metrics
        if not metrics.is_file():
            print(f"hpc_train.plot: {run_dir} has no metrics yet ({metrics} does not exist)", file=sys.stderr)
            return ExitCode.USAGE
        for path in plot_run(run_dir):
            print(path)
    if args.compare:
        print(plot_compare(args.run_dirs, args.compare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
