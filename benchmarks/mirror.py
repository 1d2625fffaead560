"""What the mirror (``trainer.mirror``) costs training: the same run with and without it.

    python benchmarks/mirror.py --url /project/me/bench-mirror [--steps 120 --every 20 --width 2048 --layers 3]
    AWS_ENDPOINT_URL=http://127.0.0.1:8333 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
        python benchmarks/mirror.py --url s3://bucket/bench

``python -m hpc_train`` on the local launcher trains an MLP of ``layers`` hidden layers of ``width`` (784 inputs;
2048 x 3 makes a 71 MB checkpoint with AdamW) for ``steps`` steps with a checkpoint every ``every`` steps,
after ``warm-ups`` runs that are not counted (one by default), ``repeats`` times each way, alternating: without a
mirror, and with ``--url`` as the mirror (cleared before each run). Prints each run's time from launch to exit,
the median of each way and the difference, and from rank 0's log how long the end of training waited for the
last copy and how long the copies took (``status/mirror.json`` keeps the last one's). Run it against the store
your runs would use: the copies share the CPU and the network with training.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpc_train.core.rundir import RunDir
from hpc_train.mirror import Store


def _run(folder: Path, args: argparse.Namespace, url: str) -> tuple[float, str]:
    run_dir = folder / "run"
    command = [
        sys.executable,
        "-m",
        "hpc_train",
        f"hydra.run.dir={run_dir}",
        "cluster.tasks_per_node=1",
        f"model.hidden_sizes=[{','.join([str(args.width)] * args.layers)}]",
        f"trainer.max_steps={args.steps}",
        "trainer.max_epochs=0",
        f"trainer.checkpoint_every_n_steps={args.every}",
        "trainer.val_every_n_epochs=0",
        "trainer.progress_bar=false",
        "trainer.plots=false",
        "trainer.tensorboard=false",
        *([f"trainer.mirror={url}"] if url else []),
    ]
    started = time.monotonic()
    with (folder / "out.txt").open("w") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=args.steps * 30 + 600)
    took = time.monotonic() - started
    log = (run_dir / "logs" / "rank_0.log").read_text()
    return took, log


def _clear(url: str) -> None:
    store = Store(url)
    if store.fs.exists(store.root):
        store.fs.rm(store.root, recursive=True)


LANDED = r"the copy after the end of training landed, verified, ([0-9.]+) s later"
"""Rank 0's log line that says how long the end of training waited for the last copy."""


def _mirror_figures(run_dir: Path, log: str) -> str:
    """What a mirrored run says of its copies: the checkpoint's size, the last copy's seconds, the end's wait."""
    landed = re.search(LANDED, log)
    state = RunDir(run_dir).mirror_state()
    took = f"{state.seconds:.2f}" if state is not None and state.seconds is not None else "?"
    size = os.path.getsize(next((run_dir / "checkpoints").glob("step_*.pt")))
    waited = landed.group(1) if landed else "?"
    return f"; checkpoint {size / 1e6:.0f} MB, the last copy took {took} s, the end waited {waited} s for it"


def _measured(args: argparse.Namespace, way: str) -> float:
    """One counted run, ``way`` "none" or "mirror", in a folder of its own; prints and returns its seconds."""
    folder = Path(tempfile.mkdtemp(prefix=f"mirror-bench-{way}-", dir=args.dir))
    try:
        if way == "mirror":
            _clear(args.url)
        took, log = _run(folder, args, args.url if way == "mirror" else "")
        extra = _mirror_figures(folder / "run", log) if way == "mirror" else ""
        print(f"{way:>6}: {took:6.1f} s from launch to exit{extra}", flush=True)
        return took
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _warm_up(args: argparse.Namespace) -> None:
    """Runs not counted: the first launch reads every module from disk."""
    for _ in range(args.warm_ups):
        warm = Path(tempfile.mkdtemp(prefix="mirror-bench-warm-", dir=args.dir))
        try:
            print(f"warm-up: {_run(warm, args, '')[0]:.1f} s (not counted)", flush=True)
        finally:
            shutil.rmtree(warm, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the mirror: a path or an fsspec URL (cleared before each run)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warm-ups", type=int, default=1, help="runs before the counted ones, not counted")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    _warm_up(args)
    times: dict[str, list[float]] = {"none": [], "mirror": []}
    for repeat in range(args.repeats):
        for way in ("none", "mirror") if repeat % 2 == 0 else ("mirror", "none"):
            times[way].append(_measured(args, way))
    none, mirror = statistics.median(times["none"]), statistics.median(times["mirror"])
    print(
        f"median: without {none:.1f} s, with the mirror {mirror:.1f} s: {mirror - none:+.1f} s "
        f"({100 * (mirror - none) / none:+.1f}%) for {args.steps // args.every} checkpoints to {args.url}"
    )


if __name__ == "__main__":
    main()
