"""The parts of running a user's script: its output copied to the rank log, a failure's hint, the look for a
sign of training, and its traceback from its own frame."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from hpc_train.core.rundir import RunDir
from hpc_train.runtime.script import _Copy, _Files, _hint
from hpc_train.runtime.script_boot import from_the_script

from .test_config import composed


def test_the_log_gets_whole_lines_from_both_streams(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    log.write_text("hpc_train line\n")
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    sys.stdout.write('out'); sys.stdout.flush(); time.sleep(0.02)\n"
        "    sys.stderr.write('err'); sys.stderr.flush(); time.sleep(0.02)\n"
        "    sys.stdout.write(f' {i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write(f' {i}\\n'); sys.stderr.flush()\n"
        "sys.stderr.write('no newline at the end')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    sink_out, sink_err = (os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT) for name in ("out", "err"))
    copies = [_Copy(child.stdout, sink_out, fd, "stdout"), _Copy(child.stderr, sink_err, fd, "stderr")]
    child.wait()
    for copy in copies:
        copy.wait()
    os.close(fd)
    lines = log.read_text().splitlines()
    assert lines[0] == "hpc_train line"
    assert sorted(lines[1:]) == sorted(
        [f"out {i}" for i in range(3)] + [f"err {i}" for i in range(3)] + ["no newline at the end"]
    )
    assert (tmp_path / "out").read_text() == "out 0\nout 1\nout 2\n"  # the console copy is as it came
    assert copies[1].tail(1) == "no newline at the end"


def test_nccl_without_gpus_gets_a_hint_that_names_the_keys() -> None:
    one = composed("script.module=pkg.train", "cluster.tasks_per_node=1")
    hint = _hint(one, "RuntimeError: Distributed package doesn't have NCCL built in")
    assert "cluster.gpus_per_node=0" in hint and "backend='gloo'" in hint and "script.torchrun_env=false" in hint
    two = _hint(composed("script.module=pkg.train"), "ProcessGroupNCCL is only supported with GPUs")
    assert "cluster.gpus_per_node=0" in two and "torchrun_env" not in two  # not for 2 ranks
    assert _hint(one, "ValueError: something else") == ""
    assert _hint(composed("cluster=slurm", "cluster.gpus_per_node=1", "script.module=pkg.train"), "NCCL error") == ""


def test_a_written_file_is_a_sign_of_training_and_hpc_trains_own_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rd = RunDir(tmp_path / "run")
    (rd.path / "logs").mkdir(parents=True)
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "work" / "data" / "old.csv").write_text("x")
    monkeypatch.chdir(tmp_path / "work")
    files = _Files.snapshot(rd)
    (rd.path / "logs" / "rank_0.log").write_text("hpc_train's own")
    (rd.path / "status").mkdir()
    (rd.path / "status" / "rank_0.json").write_text("{}")
    assert not files.changed()
    time.sleep(0.01)
    (tmp_path / "work" / "data" / "old.csv").write_text("rewritten")
    assert files.changed()
    files = _Files.snapshot(rd)
    (tmp_path / "work" / "ckpt").mkdir()
    (tmp_path / "work" / "ckpt" / "model.pt").write_text("w")
    assert files.changed()
    # Console output grows whatever the script does: `> train.log` in the working directory, Slurm's output...
    (tmp_path / "work" / "train.log").write_text("")
    (tmp_path / "work" / "console").write_text("")
    files = _Files.snapshot(rd)
    time.sleep(0.01)
    (tmp_path / "work" / "train.log").write_text("more output")
    assert not files.changed()
    # ...and so does a file that this process (or one it descends from) writes its stdout to, whatever its name.
    with (tmp_path / "work" / "console").open("w") as console:
        child = [sys.executable, "-c", "from hpc_train.runtime.script import _console_files; print(_console_files())"]
        subprocess.run(child, stdout=console, check=True)
    assert str(tmp_path / "work" / "console") in (tmp_path / "work" / "console").read_text()
    monkeypatch.setattr(_Files, "LIMIT", 1)  # too many to look at: it cannot tell, and does not flag
    assert _Files.snapshot(rd).changed()


def test_a_scripts_traceback_starts_at_its_own_frame(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("def f():\n    raise KeyError('k')\nf()\n")
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.script_boot", str(script)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[:2] == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 3, in <module>',
    ]
    assert proc.stderr.strip().endswith("KeyError: 'k'") and "runpy" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.script_boot", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "nope.py" in missing.stderr  # nothing of the script: the whole traceback
    assert from_the_script(None) is None


def test_a_launch_record_holds_the_command_its_variables_and_stops_and_runs_as_given(tmp_path: Path) -> None:
    """``ScriptLaunch.of`` for rank 1 of 2 and a plain run of it: the child sees the torchrun variables over the
    caller's, its output lands in the rank log, and a SIGHUP that reaches the rank is passed on as SIGTERM (a
    stop). Rank 1 hosts no store."""
    from hpc_train.runtime.script import ScriptLaunch, rendezvous_store, run_script

    from .test_process_group import env_with

    (tmp_path / "train.py").write_text("")
    cfg = composed(f"script.path={tmp_path / 'train.py'}", "cluster.signal=USR1")
    env = env_with(1, 2)
    launch = ScriptLaunch.of(cfg.script, env, cfg.cluster, str(tmp_path), 3, tmp_path / "rank_1.log", {"RANK": "9"})
    assert launch.argv[-1] == str(tmp_path / "train.py") and launch.variables["RANK"] == "1"  # the torchrun ones win
    assert launch.variables["HPC_TRAIN_ATTEMPT"] == "3" and launch.stop_signals == {10, 15, 2}
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print(os.environ['RANK'], os.environ['LOCAL_WORLD_SIZE'], flush=True)\n"
        "time.sleep(0.5)\n"  # the rank's handlers are in place by then (here no start-up's are before them)
        "os.kill(os.getppid(), signal.SIGHUP)\n"
        "time.sleep(30)\n"
    )
    launch = ScriptLaunch((sys.executable, "-c", code), launch.variables, launch.stop_signals, launch.log_path)
    with rendezvous_store(env, True, timedelta(seconds=5)):
        run = run_script(launch)
    assert (run.code, run.stopped_by) == (0, 15) and run.stop_to_exit_s is not None
    assert "1 2" in (tmp_path / "rank_1.log").read_text()
