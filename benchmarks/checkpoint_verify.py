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


def _median_s(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="checkpoint size in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    state = _state(args.mb)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        run = RunDir(Path(folder) / "run")
        store = Checkpoints(run)
        plain = Path(folder) / "plain.pt"
        steps = iter(range(1, 10_000))
        save_plain = _median_s(lambda: save_atomic(state, plain), args.repeats)
        save_verified = _median_s(lambda: store.save(state, next(steps), keep=1), args.repeats)
        record = store.records()[-1]
        path = run.checkpoints / record.file
        load_plain = _median_s(lambda: torch.load(path, weights_only=True), args.repeats)
        load_verified = _median_s(lambda: verify_checkpoint(path, record), args.repeats)
    size = path.stat().st_size / (1 << 20) if path.exists() else args.mb
    print(f"checkpoint of {args.mb} MiB ({size:.0f} MiB on disk), median of {args.repeats}, in {args.dir}:")
    print(
        f"  save: plain atomic {save_plain:.3f} s, with SHA-256 and ledger {save_verified:.3f} s "
        f"(+{100 * (save_verified / save_plain - 1):.0f}%)"
    )
    print(
        f"  load: plain {load_plain:.3f} s, verified (digest, load, finite) {load_verified:.3f} s "
        f"(+{100 * (load_verified / load_plain - 1):.0f}%; {args.mb / max(load_verified - load_plain, 1e-9):.0f} MiB/s "
        "for the checks)"
    )


if __name__ == "__main__":
    main()
