"""What verified checkpoints cost: a save with its SHA-256 and ledger against a plain atomic torch.save, and a
verified load (digest, load, finite check) against a plain torch.load.

    python benchmarks/checkpoint_verify.py [--mb 200 --repeats 3 --dir /tmp]

The state is an AdamW-like checkpoint: weights plus two moments, float32. Prints the medians and the
throughput. Run it on the file system your checkpoints go to (--dir): a network file system changes both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc_train.core.rundir import RunDir
from hpc_train.train.checkpoint import REQUIRED_KEYS, Checkpoints, save_atomic, verify_checkpoint


def _state(megabytes: int) -> dict[str, object]:
    n = megabytes * (1 << 20) // 4 // 3  # weights and two moments
    weights = torch.randn(n)
    state: dict[str, object] = {key: 0 for key in REQUIRED_KEYS}
    state.update(
        model={"w": weights},
        optimizer={"state": {0: {"exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n)}}, "param_groups": []},
        rng=[],
    )
    return state


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Costs:
    """Median seconds of each way to save and load, and the verified checkpoint's size on disk."""

    save_plain: float
    save_verified: float
    load_plain: float
    load_verified: float
    size_mib: float


def _measure(state: dict[str, object], folder: Path, repeats: int) -> Costs:
    run = RunDir(folder / "run")
    store = Checkpoints(run)
    plain = folder / "plain.pt"
    steps = iter(range(1, 10_000))
    save_plain = _median_s(lambda: save_atomic(state, plain), repeats)
    save_verified = _median_s(lambda: store.save(state, next(steps), keep=1), repeats)
    record = store.records()[-1]
    path = run.checkpoints / record.file
    return Costs(
        save_plain,
        save_verified,
        load_plain=_median_s(lambda: torch.load(path, weights_only=True), repeats),
        load_verified=_median_s(lambda: verify_checkpoint(path, record), repeats),
        size_mib=path.stat().st_size / (1 << 20),  # here: the folder goes once this returns
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="checkpoint size in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    state = _state(args.mb)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        c = _measure(state, Path(folder), args.repeats)
    print(f"checkpoint of {args.mb} MiB ({c.size_mib:.0f} MiB on disk), median of {args.repeats}, in {args.dir}:")
    print(
        f"  save: plain atomic {c.save_plain:.3f} s, with SHA-256 and ledger {c.save_verified:.3f} s "
        f"({100 * (c.save_verified / c.save_plain - 1):+.0f}%)"
    )
    checks = args.mb / max(c.load_verified - c.load_plain, 1e-9)
    print(
        f"  load: plain {c.load_plain:.3f} s, verified (digest, load, finite) {c.load_verified:.3f} s "
        f"({100 * (c.load_verified / c.load_plain - 1):+.0f}%; {checks:.0f} MiB/s for the checks)"
    )


if __name__ == "__main__":
    main()
