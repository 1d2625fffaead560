"""Where a profiled step's time goes: summarise a torch.profiler Chrome trace (what ``trainer.profile_steps``
writes to ``<run dir>/profile``).

    python benchmarks/trace_summary.py RUN_DIR/profile/*.pt.trace.json

Prints, per profiled step: the wall time (``ProfilerStep#N`` on the host), how busy the GPU was (union of
kernel, copy and memset intervals over the span of GPU activity), kernel launches, host-device copies and
synchronisations (each one a host wait), then the kernels and host operators that took the most time.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(events: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """The figures printed by ``main``, from a trace's ``traceEvents``."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")]
    n = max(len(steps), 1)
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in spans if e.get("cat") in GPU_CATEGORIES]
    runtime = Counter(str(e["name"]) for e in spans if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    by_kernel: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for e in spans:
        if e.get("cat") == "kernel":
            by_kernel[str(e["name"])] += float(e["dur"])
        elif e.get("cat") == "cpu_op":
            by_op[str(e["name"])] += float(e["dur"])
    gpu_span = (max(b for _, b in gpu) - min(a for a, _ in gpu)) if gpu else 0.0
    return {
        "steps": len(steps),
        "step_ms": sum(float(e["dur"]) for e in steps) / n / 1e3,
        "gpu_busy": _busy(gpu) / gpu_span if gpu_span else 0.0,
        "kernels_per_step": sum(1 for e in spans if e.get("cat") == "kernel") / n,
        "runtime_calls_per_step": {name: count / n for name, count in runtime.most_common()},
        "syncs_per_step": sum(c for name, c in runtime.items() if "Synchronize" in name) / n,
        "top_kernels_ms_per_step": [(k, v / n / 1e3) for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])][
            :top
        ],
        "top_host_ops_ms_per_step": [(k, v / n / 1e3) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])][:top],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    for path in args.traces:
        s = summarise(json.loads(path.read_text())["traceEvents"], args.top)
        print(f"== {path.name}: {s['steps']} steps, {s['step_ms']:.3f} ms a step (host), GPU busy {s['gpu_busy']:.1%}")
        print(f"   kernels/step {s['kernels_per_step']:.1f}; host syncs/step {s['syncs_per_step']:.2f}")
        calls = ", ".join(f"{k} {v:.1f}" for k, v in list(s["runtime_calls_per_step"].items())[:8])
        print(f"   runtime calls/step: {calls}")
        for title, key in (
            ("kernels", "top_kernels_ms_per_step"),
            ("host ops (inclusive)", "top_host_ops_ms_per_step"),
        ):
            print(f"   top {title}, ms/step:")
            for name, ms in s[key]:
                print(f"     {ms:8.3f}  {name[:110]}")


if __name__ == "__main__":
    main()
