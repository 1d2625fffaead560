"""A user's script as its author meets it: what a failure prints, where every rank's output goes, a script that
branches on LOCAL_RANK (DeepLIIF), one that exits 0 without training, and pdb in the script's own frame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAILS_ON_RANK_0 = """
import os, sys
rank = os.environ["RANK"]
print(f"out of rank {rank}", flush=True)
print(f"err of rank {rank}", file=sys.stderr, flush=True)

def train(step):
    if rank == "0":
        raise RuntimeError(f"loss went wrong at step {step}")

train(3)
"""

# What DeepLIIF does: its DDP path (NCCL, GPUs only) whenever LOCAL_RANK is set, else one plain process.
BRANCHES_ON_LOCAL_RANK = """
import os, sys
if "LOCAL_RANK" in os.environ:
    import torch.distributed as dist
    dist.init_process_group(backend="nccl")
with open(sys.argv[1], "w") as f:
    f.write("trained as a single process")
"""

DOES_NOTHING = "import sys\nprint('usage: ...', file=sys.stderr)\n"

# Rank 0 leaves first; rank 1 uses the rendezvous store (which rank 0's worker hosts) seconds later, then says
# whether the worker that runs it has torch loaded.
LEAVES_LATE = """
import json, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
rank = dist.get_rank()
if rank == 1:
    time.sleep(3)
    store = dist.distributed_c10d._get_default_store()
    store.set("late", "still served")
    with open(f"/proc/{os.getppid()}/maps") as maps:
        torch_in_worker = "libtorch" in maps.read()
    seen = {"store": store.get("late").decode(), "torch_in_worker": torch_in_worker}
    with open(sys.argv[1], "w") as out:
        json.dump(seen, out)
dist.destroy_process_group()
"""

DEBUG_ME = """
import sys
secret = 41 + 1
if "--fail" in sys.argv:
    raise ValueError(f"bad batch {secret}")
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _jobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc_train.jobs", *args], capture_output=True, text=True, timeout=60)


def test_a_failing_script_prints_its_traceback_once_then_one_summary(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = _script(tmp_path, "train.py", FAILS_ON_RANK_0)
    proc, run_dir = run_cli(f"script.path={script}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr
    # The script's traceback as `python train.py` prints it, once: from its own frame, none of hpc_train's.
    assert err.count("Traceback (most recent call last)") == 1, err
    traceback = err[err.index("Traceback") :]
    assert traceback.splitlines()[1].strip().startswith(f'File "{script}"'), traceback
    assert "RuntimeError: loss went wrong at step 3" in traceback
    assert "submitit ERROR" not in err and "hpc_train.runtime.script.ScriptError" not in err, err
    assert "runpy" not in err and "script_boot" not in err, err
    # Then one summary, which ends the output.
    summary = err[err.index("hpc_train: job FAILED") :].splitlines()
    assert "failed first: ScriptError" in summary[1] and "loss went wrong at step 3" in summary[1], summary
    assert len(summary) == 3 and "rank 0's output is above" in summary[2], summary
    # Every rank's output is in its log, beside hpc_train's lines; `jobs logs --rank` shows it.
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank_{rank}.log").read_text()
        assert f"out of rank {rank}\n" in log and f"err of rank {rank}\n" in log, log
        assert "running " in log  # hpc_train's own line
    logs = _jobs("logs", str(run_dir), "--rank", "1")
    assert logs.returncode == 0 and "out of rank 1" in logs.stdout and "err of rank 1" in logs.stdout, logs
    # hpc_train's own traceback is kept, in the failing rank's log only.
    assert "hpc_train.runtime.script.ScriptError" in (run_dir / "logs" / "rank_0.log").read_text()


def test_a_script_that_branches_on_local_rank_runs_as_one_plain_process(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = _script(tmp_path, "deepliif_like.py", BRANCHES_ON_LOCAL_RANK)
    out = tmp_path / "model.txt"
    one = ["cluster.tasks_per_node=1", f"script.path={script}", f"script.args=[{out}]"]
    # With the torchrun variables it takes its NCCL path and fails; the summary says why and what to do.
    proc, _ = run_cli(*one, run_dir=tmp_path / "torchrun")
    assert proc.returncode == 1 and not out.exists()
    summary = proc.stderr[proc.stderr.index("hpc_train: job FAILED") :]
    assert "HINT: the script uses NCCL" in summary and "cluster.gpus_per_node=0" in summary, summary
    assert "script.torchrun_env=false" in summary, summary
    # script.torchrun_env=false: a plain process, which trains.
    proc, run_dir = run_cli(*one, "script.torchrun_env=false", run_dir=tmp_path / "plain")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == "trained as a single process"
    assert "as a plain process" in (run_dir / "logs" / "rank_0.log").read_text()
    assert "warning" not in proc.stderr  # it wrote a file: it did something


def test_a_script_that_exits_0_without_training_is_flagged(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An executable that exits 0 without training (as `deepliif trainlaunch` does), run through script.command
    from PATH; `jobs status` still reads the finished run once that executable is gone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "trainlaunch"
    launcher.write_text(f"#!{sys.executable}\n{DOES_NOTHING}")
    launcher.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    proc, run_dir = run_cli("cluster.tasks_per_node=1", "script.command=trainlaunch", env={"PATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = next(line for line in proc.stderr.splitlines() if line.startswith("hpc_train: warning:"))
    assert "trainlaunch exited 0 after" in warning and "with no progress reported" in warning, warning
    launcher.unlink()
    status = _jobs("status", "--json", str(run_dir))
    assert status.returncode == 0, status.stderr
    detail = json.loads(status.stdout)[0]["detail"]
    assert detail.startswith("every rank completed") and "no progress reported" in detail, detail


def test_debug_runs_a_script_in_this_process_and_pdb_opens_in_its_frame(tmp_path: Path) -> None:
    script = _script(tmp_path, "debug_me.py", DEBUG_ME)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def debug(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={tmp_path / str(len(args))}", "cluster=debug"]
        argv += [f"script.path={script}", *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    proc = debug("--", "--fail", stdin="p secret\nq\n")
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "(Pdb) 42" in out, out  # the post-mortem's frame is the script's: its variables are there
    assert "debug_me.py(5)<module>()" in out, out
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hpc_train: the job failed in this process (cluster=debug): ValueError: bad batch 42"), last
    proc = debug()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("hpc_train: the rank completed in this process"), proc.stdout


def test_rank_0_serves_the_store_until_every_script_has_ended(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Rank 0's script ends first; rank 1's still reaches the store 3 s later (rank 0's worker keeps it up until
    rank 1's worker reports its script's end), and rank 1's worker never imported torch."""
    script = _script(tmp_path, "leaves_late.py", LEAVES_LATE)
    out = tmp_path / "seen.json"
    proc, run_dir = run_cli(f"script.path={script}", f"script.args=[{out}]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text()) == {"store": "still served", "torch_in_worker": False}
    assert "had not all ended" not in (run_dir / "logs" / "rank_0.log").read_text()
