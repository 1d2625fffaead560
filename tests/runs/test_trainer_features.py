"""The trainer's options in real runs: accumulation, precision, early stopping, strategies, observers, scripts."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_train.api import submit
from hpc_train.core.errors import ConfigError
from hpc_train.core.metrics import read_metrics
from hpc_train.core.rundir import RunDir

from ..conftest import REPO
from .test_local_runs import SMALL, weights

pytestmark = pytest.mark.slow

TUTORIAL = REPO / "hpc_train" / "examples" / "ddp_tutorial.py"
ONE_RANK = ["cluster.tasks_per_node=1"]
"""For the tests of what one rank does alone (schedules, observers, models, the notebook API): each rank costs
a process that imports torch (~4 CPU-s here). Two ranks a node are the default, run by the other tests."""


def ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_accumulating_two_batches_equals_one_batch_twice_as_big(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    common = [*SMALL, "cluster.tasks_per_node=1", "trainer.max_steps=15", "trainer.val_every_n_epochs=0"]
    acc, acc_dir = run_cli(
        *common, "trainer.batch_size=16", "trainer.accumulate_grad_batches=2", run_dir=tmp_path / "acc"
    )
    big, big_dir = run_cli(*common, "trainer.batch_size=32", run_dir=tmp_path / "big")
    ok(acc)
    ok(big)
    assert "global batch 32 (16 per rank x 1 ranks x 2 accumulated)" in acc.stderr
    w_acc, w_big = weights(acc_dir), weights(big_dir)
    for key in w_big:
        torch.testing.assert_close(w_acc[key], w_big[key], rtol=1e-4, atol=1e-5)
    rows_acc, rows_big = read_metrics(acc_dir / "metrics.jsonl"), read_metrics(big_dir / "metrics.jsonl")
    assert rows_acc[-1]["train_loss"] == pytest.approx(rows_big[-1]["train_loss"], rel=1e-4)


def test_early_stopping_stops_every_rank_at_the_same_step(run_cli) -> None:  # type: ignore[no-untyped-def]
    # min_delta so large that nothing counts as an improvement after the first validation (step 3): with
    # patience 1 both ranks must stop at the second validation, step 6, and neither may wait for the other.
    stop = ["trainer.val_every_n_steps=3", "trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=100"]
    proc, run_dir = run_cli(*SMALL, "trainer.max_steps=50", *stop)
    ok(proc)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["step"] == 6 and rows[-1]["early_stop"] is True
    statuses = [RunDir(run_dir).read_statuses()[r] for r in (0, 1)]  # rank 1's: in its node's summary
    assert [(s["state"], s["step"]) for s in statuses] == [("completed", 6), ("completed", 6)]
    best = torch.load(run_dir / "model_best.pt", weights_only=True)
    assert best.keys() == weights(run_dir).keys()
    assert any(r.get("best") for r in rows if r["step"] == 3)


def _fp16_on_cpu() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype == torch.float16
    except RuntimeError:
        return False


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(run_cli, precision: str) -> None:  # type: ignore[no-untyped-def]
    if precision == "fp16" and not _fp16_on_cpu():
        pytest.skip("this torch build has no fp16 autocast on CPU")
    proc, run_dir = run_cli(
        *SMALL, "trainer.max_steps=20", f"trainer.precision={precision}", "trainer.grad_clip_norm=1.0"
    )
    ok(proc)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert all(v.dtype == torch.float32 for v in weights(run_dir).values())  # autocast keeps fp32 master weights


@pytest.mark.parametrize("strategy", ["single"])  # dp needs a GPU: tests/gpu/test_cuda.py runs it there
def test_one_process_strategies(run_cli, strategy: str) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli(*SMALL, "trainer.max_steps=10", "cluster.tasks_per_node=1", f"trainer.strategy={strategy}")
    ok(proc)
    assert f"strategy {strategy}" in proc.stderr
    assert len(json.loads((run_dir / "rank_table.json").read_text())) == 1
    assert sorted(p.name for p in (run_dir / "status").iterdir()) == [
        "checkpoints.json",
        f"node_{socket.gethostname()}.json",  # the node's summary of its ranks
        "progress_0.json",
        "rank_0.json",
    ]
    assert not any(k.startswith("module.") for k in weights(run_dir)), "the wrapper leaked into the saved weights"


def test_schedule_warmup_then_cosine(run_cli) -> None:  # type: ignore[no-untyped-def]
    schedule = ["trainer.schedule.name=cosine", "trainer.schedule.warmup_steps=4", "trainer.log_every_n_steps=1"]
    proc, run_dir = run_cli(*SMALL, *ONE_RANK, "trainer.max_steps=12", "trainer.lr=0.01", *schedule)
    ok(proc)
    lrs = [r["lr"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert lrs[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:])) and lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_observers_write_tensorboard_profile_and_plots(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli(*SMALL, *ONE_RANK, "trainer.max_steps=10", "trainer.profile_steps=2")
    ok(proc)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(RunDir(run_dir).tensorboard_run))  # tensorboard/<the run's overrides>
    events.Reload()
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [e.step for e in events.Scalars("train_loss")] == [r["step"] for r in rows]
    assert events.Scalars("val_acc")[-1].value == pytest.approx(rows[-1]["val_acc"], rel=1e-6)
    assert list((run_dir / "profile").glob("*.json")), "no profiler trace"
    for name in ("loss.png", "metrics.png"):
        assert (run_dir / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    compare = tmp_path / "compare.png"
    cmd = [sys.executable, "-m", "hpc_train.plot", str(run_dir), "--compare", str(compare)]
    plot = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    ok(plot)
    assert compare.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "model", [["model=transformer", "data.input_shape=[16,49]"], ["model=cnn", "data.input_shape=[3,16,16]"]]
)
def test_built_in_models_train(run_cli, model: list[str]) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli("data.num_samples=2048", *ONE_RANK, "trainer.max_steps=30", "trainer.lr=3e-3", *model)
    ok(proc)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


@pytest.mark.parametrize("how", ["path", "command", "string", "passthrough"])
def test_torchrun_style_script_on_two_local_ranks(run_cli, tmp_path: Path, how: str) -> None:  # type: ignore[no-untyped-def]
    """script.path, and script.command: an executable run as it is (the interpreter, as a console script); the
    arguments as a list, as one string split like a shell would, or after a lone --."""
    out = tmp_path / "out a,b=c"
    out.mkdir()
    if how == "path":
        proc, _ = run_cli(f"script.path={TUTORIAL}", f"script.args=[--out,'{out}']")
    elif how == "string":
        proc, _ = run_cli(f"script.path={TUTORIAL}", f"script.args='--out \"{out}\"'")
    elif how == "passthrough":
        proc, _ = run_cli(f"script.path={TUTORIAL}", "--", "--out", str(out))
    else:
        proc, _ = run_cli(f"script.command={sys.executable}", f"script.args=[{TUTORIAL},--out,'{out}']")
    ok(proc)
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(s["rank"], s["local_rank"], s["world_size"]) for s in seen] == [(0, 0, 2), (1, 1, 2)]
    assert seen[0]["env"]["MASTER_PORT"] == seen[1]["env"]["MASTER_PORT"]
    assert {s["env"]["LOCAL_WORLD_SIZE"] for s in seen} == {"2"} and {s["env"]["GROUP_RANK"] for s in seen} == {"0"}
    assert seen[0]["weight_sum"] == seen[1]["weight_sum"], "DDP kept the ranks' weights in step"


def test_failing_script_fails_the_job(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, run_dir = run_cli(f"script.path={TUTORIAL}", "script.args=[--steps,2]")  # no --out: argparse exits 2
    assert proc.returncode == 1
    assert "exited with status 2" in proc.stderr
    # The script's own error, not only ours: in the launcher's summary, with its stderr (rank 0's as it came,
    # another rank's tail below the summary)...
    summary = next(line for line in proc.stderr.splitlines() if "failed first:" in line)
    assert "the following arguments are required: --out" in summary, proc.stderr[-2000:]
    assert "usage: ddp_tutorial.py" in proc.stderr
    # ...and in `jobs status`.
    status = subprocess.run(
        [sys.executable, "-m", "hpc_train.jobs", "status", "--json", str(run_dir)], capture_output=True, text=True
    )
    detail = json.loads(status.stdout)[0]["detail"]
    assert "exited with status 2" in detail and "required: --out" in detail, detail


def test_notebook_api_runs_two_configs(tmp_path: Path) -> None:
    small = ["data.num_samples=2048", "model.hidden_sizes=[32]", "trainer.max_steps=10", *ONE_RANK]
    runs = [submit(*small, f"trainer.lr={lr}", run_dir=tmp_path / f"r{i}") for i, lr in enumerate([1e-3, 1e-2])]
    results = [run.result(timeout=180) for run in runs]
    assert [r["state"] for r in results] == ["COMPLETED", "COMPLETED"]
    assert [r["final"]["lr"] for r in results] == [1e-3, 1e-2]
    assert results[0]["final"]["val_acc"] != results[1]["final"]["val_acc"]
    assert runs[0].state_dict().keys() == weights(tmp_path / "r0").keys()
    with pytest.raises(ConfigError, match=r"trainer\.lr=-1\.0 is invalid"):
        submit("trainer.lr=-1", run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_user_model_data_loss_and_metric(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """README's my_models.py: its model, data, metric and a torch loss, named by _target_."""
    from ..readme_examples import prepare_cwd

    prepare_cwd(tmp_path)
    user = [
        "model=custom",
        "model._target_=my_models.TinyNet",
        "+model.width=16",
        "data.dataset={_target_: my_models.make_data, n: 1003}",
        "trainer.metric={_target_: my_models.make_metric}",
        "trainer.loss={_target_: torch.nn.CrossEntropyLoss, label_smoothing: 0.1}",
        "trainer.batch_size=16",
        "trainer.max_steps=20",
    ]
    proc, run_dir = run_cli(*user)
    ok(proc)
    final = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert final["val_samples"] == 203, "203 validation samples over 2 ranks, each counted once"
    assert "val_acc" not in final and 0.0 <= final["val_metric"] <= 1.0
    assert sorted(weights(run_dir)) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    assert weights(run_dir)["net.0.weight"].shape == (16, 8)
    broken, _ = run_cli("model=custom", "model._target_=my_models.NoSuchNet", run_dir=tmp_path / "broken")
    # Found before any rank starts: one line, exit 2, no traceback.
    assert broken.returncode == 2 and "model._target_='my_models.NoSuchNet' cannot be imported here" in broken.stderr
    assert "has no attribute 'NoSuchNet'" in broken.stderr and "Traceback" not in broken.stderr
