"""Shared fixtures: the repo's conf/ folder and a helper that runs `python -m hpc_train` as a user would."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from hpc_train.core.records import StragglerReport

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
TESTBED = REPO / "slurm" / "testbed.sh"
"""hpc_train's own config groups, at the top of the repository; the wheel ships them as hpc_train/conf."""


def needs(*packages: str) -> pytest.MarkDecorator:
    """Skip unless ``packages`` are installed (from the test extra). Found, not imported: importing mlflow and
    wandb cost every pytest process that collects the module 3.3 CPU-s, for tests that run in one of them."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}, from the test extra")


gpu_test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
"""Marks a test that needs a GPU: skipped on CPU-only machines (CI), run with ``pytest -m gpu`` where one is."""


_SECONDS: defaultdict[str, float] = defaultdict(float)
"""Seconds spent per test folder (setup, call and teardown), for the suite's time budget."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    _SECONDS[parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SECONDS:
        spent = ", ".join(f"{folder} {seconds:.0f}s" for folder, seconds in sorted(_SECONDS.items()))
        terminalreporter.write_line(f"test time per folder (summed over workers): {spent}")


LONGEST_FIRST = (
    "tests/runs/test_wheel.py",
    "tests/runs/test_framework_preemption.py",
    "tests/runs/test_preemption.py",
    "tests/runs/test_readme.py",
    "tests/runs/test_tracking.py",
)
"""The modules that take longest (minutes each), started first when scripts/test.sh spreads tests/ over pytest-xdist
workers (by module), so that none of them starts last and leaves a worker running alone at the end."""


GENERATIONS = ("22.05", "24.11")
"""The Slurm generations the testbed runs (slurm/testbed.sh, HPC_TESTBED_SLURM); 22.05 is the default."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slurm",
        choices=GENERATIONS,
        default=os.environ.get("HPC_TESTBED_SLURM", "22.05"),
        help="the testbed's Slurm generation; on any but 22.05 only the tests marked `generations` run",
    )


def pytest_configure(config: pytest.Config) -> None:
    generation = config.getoption("--slurm")
    if generation == "22.05":
        return
    # The generation's clients first on PATH, with their config: what `eval "$(slurm/testbed.sh env)"` does in a
    # shell. Every test, hpc_train and the jobs' own steps (sbatch passes the environment on) then drive it.
    said = subprocess.run(
        ["bash", "-c", f'eval "$({TESTBED} env)" && printf "%s\\0%s" "$PATH" "$SLURM_CONF"'],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HPC_TESTBED_SLURM": generation},
        check=True,
    )
    os.environ["PATH"], os.environ["SLURM_CONF"] = said.stdout.split("\0")
    os.environ["HPC_TESTBED_SLURM"] = generation


def _only_generations(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a testbed of another generation than 22.05, only the tests marked ``generations`` run."""
    generation = config.getoption("--slurm")
    if generation == "22.05":
        return
    skip = pytest.mark.skip(reason=f"runs on 22.05 only (--slurm {generation}: the tests marked `generations`)")
    for item in items:
        if "generations" not in item.keywords:
            item.add_marker(skip)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _only_generations(config, items)

    def place(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        first = [i for i, name in enumerate(LONGEST_FIRST) if module == name]
        return first[0] if first else len(LONGEST_FIRST) + module.startswith("tests/unit/")  # unit tests fill in

    items.sort(key=place)  # stable: the order within a module, and among the rest, is kept


@pytest.fixture
def run_cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run ``python -m hpc_train <args>`` in a fresh run dir; returns (completed process, run dir)."""

    def run(*args: str, run_dir: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180):
        run_dir = run_dir or tmp_path / "run"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=tmp_path,
        )
        return proc, run_dir

    return run


def start_in_foreground(argv: list[str]) -> subprocess.Popen[str]:
    """Start a launcher the way a terminal starts a foreground command, so that a SIGINT (Ctrl-C) reaches it.

    A shell starts background jobs (`cmd &`, as CI may run the suite) with SIGINT ignored, and Python keeps an
    ignored SIGINT ignored, so without this the launcher would never see the Ctrl-C.
    """
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def assert_bitwise_equal(a: Path, b: Path) -> None:
    """The final weights of two run directories are identical to the last bit (resume tests, local and Slurm)."""
    wa, wb = (torch.load(d / "model_final.pt", weights_only=True) for d in (a, b))
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{different} differ: max {max((wa[k] - wb[k]).abs().max().item() for k in different)}"


def wait_for_step(
    out: Path, attempt: int, step: int, timeout: float = 240, alive: Callable[[], bool] = lambda: True
) -> int:
    """Wait until attempt ``attempt`` (counting from 1) of an example script writing into ``out`` has started and
    its rank 0 has reached ``step``; returns the step reached. The example scripts (hpc_train/examples) record
    each attempt's first step in ``starts.txt`` and the step reached in ``step.txt``. ``alive``: false once the
    run has ended, which fails the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        starts = (out / "starts.txt").read_text().split() if (out / "starts.txt").exists() else []
        text = (out / "step.txt").read_text().strip() if (out / "step.txt").exists() else ""
        reached = int(text) if text else 0  # read while rank 0 rewrites it: empty for a moment
        if len(starts) >= attempt and reached >= step:
            return reached
        assert alive(), f"the run ended before attempt {attempt} reached step {step}: {starts}, {reached}"
        assert time.monotonic() < deadline, f"attempt {attempt} never reached step {step}: {starts}, {reached}"
        time.sleep(0.05)


def wait_for_verdict(
    run_dir: Path, names: Callable[[set[int]], bool], timeout: float
) -> tuple[StragglerReport | None, float]:
    """Rank 0's newest straggler verdict whose named ranks ``names`` accepts, once there is one, and the seconds
    waited for it (None: none within ``timeout``)."""
    from hpc_train.core.rundir import RunDir

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(1)
        named = [e for e in RunDir(run_dir).straggler_reports() if names({r.rank for r in e.ranks})]
        if named:
            return named[-1], time.monotonic() - started
    return None, time.monotonic() - started


def wait_for_ranks(
    run_dir: Path,
    step: int,
    timeout: float = 180,
    alive: Callable[[], bool] = lambda: True,
    explain: Callable[[], str] = lambda: "",
) -> None:
    """Wait until every rank of the run in ``run_dir`` has reached ``step``: rank 0's metrics row of that step or a
    later one (written once the ranks' losses are reduced at that step, so every rank is there), or every rank's
    status. The row comes first: statuses reach ``status/`` through the nodes' summaries, every 10 s in steady
    training, and a short run can be over between two of them (a signal meant for mid-run came after its end).
    ``alive``: false once the run has ended, which fails the wait at once; ``explain``: what a failed wait adds
    to its message (the run's output)."""
    from hpc_train.core.rundir import RunDir

    def reached() -> int:
        rd = RunDir(run_dir)
        rows = max((int(row.get("step") or 0) for row in rd.read_metrics()), default=0)
        return max(rows, min((s.get("step") or 0 for s in rd.read_statuses().values()), default=0))

    deadline = time.monotonic() + timeout
    while reached() < step:
        assert alive(), f"the run ended before every rank reached step {step}: {explain()}"
        assert time.monotonic() < deadline, f"no step {step} on every rank within {timeout:g}s: {explain()}"
        time.sleep(0.05)


class Background:
    """A command started now and waited for only when a test needs what it wrote (an uninterrupted baseline run,
    beside the run a test interrupts). Its output goes to ``<log>``: a pipe nobody reads would fill and stall it."""

    def __init__(self, argv: list[str], result: Path, log: Path, timeout: float = 300) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.result, self.log, self.timeout = result, log, timeout
        with log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)

    def ready(self) -> Path:
        """``result`` once the command has exited 0."""
        try:
            code = self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"{self.proc.args} still running after {self.timeout}s") from None
        assert code == 0, f"{self.proc.args} exited {code}: {self.log.read_text()[-3000:]}"
        return self.result
