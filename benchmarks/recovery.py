"""Recovery figures on the Slurm testbed: restart latency, in the allocation and through a requeue, and ETTR.

    slurm/testbed.sh start
    python benchmarks/recovery.py --repeats 3 --ettr-minutes 5 --out recovery-out

1. Restart latency: from the moment a rank's training process is SIGKILLed (in-allocation restart) or the
   job gets the preemption signal (the requeue path: checkpoint, `scontrol requeue`, queue, new job) to the
   end of the first optimizer step of the next attempt. 2 nodes x 2 ranks (+1 spare node for the kill),
   checkpoints every 10 steps, at step 40.
2. ETTR of a run of --ettr-minutes with a rank killed at random every --mtbf-s (uniform in [0.5, 1.5] x mtbf)
   and then the same run without faults, both 2 nodes x 1 rank on node1 and node2; each is ended with
   scancel after the given minutes and read from its status/goodput.json.
Prints the figures and writes results.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc_train.core.rundir import RunDir, read_json

JOB = [
    "cluster=slurm",
    "cluster.nodes=2",
    "cluster.tasks_per_node=2",
    "data.num_samples=4096",
    "model.hidden_sizes=[512,512]",
    "trainer.max_epochs=0",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=10",
    "trainer.plots=false",
    "trainer.tensorboard=false",
    "trainer.progress_bar=false",
    # The benchmark acts on the steps it reads from the ranks' statuses (wait_step, the ranks it may kill), and
    # those reach status/ in their node's summary every cluster.status_every_s: at the default 10 s, a run of 150
    # steps may end before its statuses show step 40. 1 s, as tests/integration uses, keeps them fresh.
    "cluster.status_every_s=1",
]


def submit(run_dir: Path, *args: str) -> str:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train", *args, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=run_dir.parent,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return str(read_json(RunDir(run_dir).job_record)["job_id"])


def wait_gone(job_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
        if not out.strip():
            return
        time.sleep(0.5)
    raise SystemExit(f"job {job_id} still in the queue after {timeout:.0f}s")


def wait_step(rd: RunDir, step: int, ranks: int, timeout: float = 300) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = rd.read_statuses()
        running = [s for s in statuses.values() if s.get("state") == "running"]
        if len(running) == ranks and min(int(s.get("step", 0)) for s in running) >= step:
            return statuses
        time.sleep(0.02)
    raise SystemExit(f"{rd.path}: no step {step} within {timeout:.0f}s")


def first_step_after(rd: RunDir, attempt: int, timeout: float = 300) -> float:
    """The wall-clock end of the first step of ``attempt``, from rank 0's progress file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        attempts = rd.read_attempts()
        progress = rd.read_progress(0)
        current = attempts[-1] if attempts and attempts[-1].get("attempt") == attempt else None
        if current is not None and float(progress.get("first_time") or 0) > float(current["start"]):
            return float(progress["first_time"])
        time.sleep(0.05)
    raise SystemExit(f"{rd.path}: attempt {attempt} made no step within {timeout:.0f}s")


def latency_in_allocation(root: Path, i: int) -> float:
    rd = RunDir(root / f"kill{i}")
    job = submit(rd.path, *JOB, "trainer.max_steps=150", "cluster.slurm.partition=all", "cluster.slurm.spare_nodes=1")
    statuses = wait_step(rd, 40, ranks=4)
    victim = next(s for s in statuses.values() if s["host"] == "node2")
    killed = time.time()
    os.kill(int(victim["pid"]), signal.SIGKILL)
    latency = first_step_after(rd, 1) - killed
    wait_gone(job, 300)
    return latency


def latency_requeue(root: Path, i: int) -> float:
    rd = RunDir(root / f"requeue{i}")
    job = submit(rd.path, *JOB, "trainer.max_steps=150")
    wait_step(rd, 40, ranks=4)
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    latency = first_step_after(rd, 1) - signalled
    wait_gone(job, 300)
    return latency


def run_for(rd: RunDir, shape: list[str], minutes: float, mtbf_s: float, rng: random.Random | None) -> int:
    """Run the job for ``minutes``, killing a random live rank every ~``mtbf_s`` when ``rng`` is given, then
    scancel it. Returns the number of kills."""
    job = submit(rd.path, *shape)
    kills = 0
    start = time.monotonic()
    next_kill = start + (rng.uniform(0.5, 1.5) * mtbf_s if rng else float("inf"))
    while time.monotonic() - start < minutes * 60:
        time.sleep(0.2)
        if rng is None or time.monotonic() < next_kill:
            continue
        live = [s for s in rd.read_statuses().values() if s.get("state") == "running" and s.get("step", 0) > 0]
        if live:
            try:
                os.kill(int(rng.choice(live)["pid"]), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * mtbf_s
    subprocess.run(["scancel", job], check=True, timeout=30)
    wait_gone(job, 120)
    return kills


def ettr_pair(root: Path, minutes: float, mtbf_s: float, seed: int) -> dict[str, Any]:
    """The same job with random kills and without, one after the other, for ``minutes`` each; their ledgers.
    Not side by side: each holds both nodes of the debug partition."""
    shape = [*JOB, "cluster.tasks_per_node=1", "trainer.max_steps=10000000"]
    faulty = RunDir(root / "ettr-faults")
    clean = RunDir(root / "ettr-clean")
    limits = ["cluster.slurm.max_failures=1000", "cluster.slurm.max_stalled_failures=1000"]
    kills = run_for(faulty, [*shape, *limits], minutes, mtbf_s, random.Random(seed))
    run_for(clean, shape, minutes, mtbf_s, None)
    return {"kills": kills, "faults": faulty.read_goodput(), "clean": clean.read_goodput()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ettr-minutes", type=float, default=5.0)
    parser.add_argument("--mtbf-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("recovery-out"))
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    root = args.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    if not args.skip_latency:
        inside = [latency_in_allocation(root, i) for i in range(args.repeats)]
        requeue = [latency_requeue(root, i) for i in range(args.repeats)]
        results["latency_in_allocation_s"], results["latency_requeue_s"] = inside, requeue
        for name, values in (("in-allocation restart (SIGKILL)", inside), ("requeue (USR2)", requeue)):
            print(
                f"{name:34s} median {statistics.median(values):5.1f} s  "
                f"[{min(values):.1f}-{max(values):.1f}] over {len(values)}"
            )
    if args.ettr_minutes > 0:
        pair = ettr_pair(root, args.ettr_minutes, args.mtbf_s, args.seed)
        results["ettr"] = pair
        for name in ("faults", "clean"):
            g = pair[name]
            print(
                f"ETTR {name:6s}: {g.get('ettr')}  wall {g.get('wall_s')} s, productive {g.get('productive_s')} s, "
                f"lost {g.get('lost_s')} s (startup {g.get('startup_s')}, redone {g.get('redone_s')}, gaps "
                f"{g.get('restart_gaps_s')}), attempts {g.get('attempts')}"
            )
        print(f"kills: {pair['kills']} in {args.ettr_minutes:g} min")
    (root / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
