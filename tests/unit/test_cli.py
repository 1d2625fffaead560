"""What a user meets first: `hpc-train --help`, and errors for what Hydra's grammar or Slurm would refuse."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.api import compose_config
from hpc_train.core.errors import ConfigError

HPC_TRAIN = Path(sys.executable).parent / "hpc-train"  # the console script pip installed beside this Python


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HPC_TRAIN), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_help_names_the_program_and_only_real_options(tmp_path: Path) -> None:
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "mycluster.yaml").write_text("launcher: slurm\n")
    (tmp_path / "conf" / "experiment").mkdir()
    (tmp_path / "conf" / "experiment" / "quick.yaml").write_text("# @package _global_\n")
    proc = run("--help", "--config-dir", "conf", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: hpc-train") and "python -m hpc_train" in proc.stdout
    assert "__main__" not in proc.stdout and "schema_" not in proc.stdout
    assert "cluster  debug, local, mycluster, slurm" in proc.stdout
    assert "model    cnn, custom, mlp, transformer" in proc.stdout
    assert "+experiment quick" in proc.stdout  # a group of the user's own, picked with +experiment=quick
    assert "script.path=train.py [-- ARGS]" in proc.stdout and "trainer.init_from=RUN_DIR" in proc.stdout


def test_console_script_composes_from_any_folder(tmp_path: Path) -> None:
    proc = run("--cfg", "job", "trainer.max_steps=7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "max_steps: 7" in proc.stdout and "launcher: local" in proc.stdout


def test_unquoted_hostlist_gets_the_quoted_form(tmp_path: Path) -> None:
    proc = run("cluster=slurm", "cluster.exclude=node[07-08]", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 2
    assert """HINT: write 'cluster.exclude="node[07-08]"'""" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(ConfigError, match=r"brackets start a list"):
        compose_config("cluster=slurm", "cluster.exclude=node[07-08]")
    assert compose_config("cluster=slurm", 'cluster.exclude="node[07-08]"').cluster.exclude == "node[07-08]"


@pytest.mark.parametrize(("value", "reason"), [("node[3-1]", "start > stop"), ("node[1-2", "unbalanced brackets")])
def test_invalid_hostlist_is_refused_with_the_reason(value: str, reason: str) -> None:
    expected = rf"cluster\.slurm\.exclude={re.escape(repr(value))} is invalid: not a Slurm hostlist \({reason}\)"
    with pytest.raises(ConfigError, match=expected):
        compose_config("cluster=slurm", f'cluster.exclude="{value}"')


def test_dry_run_without_slurm_says_what_it_did_not_check(tmp_path: Path) -> None:
    """On a laptop (no sinfo, no sbatch on PATH, no recorded facts) a dry run says plainly that nothing was checked."""
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train", "cluster=slurm", "cluster.dry_run=true", f"hydra.run.dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": str(bare)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dry run did NOT check the request: no Slurm answers here" in proc.stdout


def test_paths_are_checked_before_any_submission(tmp_path: Path) -> None:
    """script.path and script.command are looked up on this machine before anything is submitted: a Slurm dry
    run and each element of a sweep too (a saved config is not checked so when it is loaded: test_config)."""
    for args, said in [
        (
            [
                "cluster=slurm",
                "cluster.dry_run=true",
                "script.command=no-such-trainer-cmd",
                f"hydra.run.dir={tmp_path}/r",
            ],
            "config error: script.command='no-such-trainer-cmd' is invalid: not an executable on PATH",
        ),
        (
            ["-m", "trainer.lr=0.1,0.2", "script.path=missing.py", f"hydra.sweep.dir={tmp_path}/sweep"],
            "config error in the sweep, nothing was submitted: script.path='missing.py' is invalid: no such file",
        ),
    ]:
        proc = run(*args, cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "config.yaml").exists() and not list(tmp_path.glob("sweep/*/config.yaml"))


def test_a_group_of_your_own_gets_the_plus_hint(tmp_path: Path) -> None:
    from hpc_train.config import check_overrides

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "quick.yaml").write_text("# @package _global_\n")
    with pytest.raises(ConfigError, match=r"experiment=quick: .*HINT: add it with a plus: \+experiment=quick"):
        check_overrides(["--config-dir", str(tmp_path), "experiment=quick"])


def test_what_can_be_checked_before_launch_is(tmp_path: Path) -> None:
    """A _target_ that does not take a configured key, and GPUs this machine does not have: one block, exit 2,
    before any rank starts (no run dir content beyond what Hydra makes)."""
    from hpc_train.launch.preflight import check_devices

    proc = run(
        "model=custom",
        "model._target_=torch.nn.Linear",
        "+model.in_features=784",
        "+model.out_features=10",
        "+model.widht=3",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "model.widht is configured, but torch.nn.Linear() takes no argument 'widht'" in proc.stderr
    assert "in_features, out_features, bias, device, dtype" in proc.stderr
    assert not (tmp_path / "r" / "rank_table.json").exists()
    cfg = compose_config("cluster=debug", "trainer.device=cuda")
    with pytest.raises(ConfigError, match=r"trainer\.device=cuda asks for 1 GPU\(s\), but torch sees 0"):
        check_devices(cfg, cuda_count=lambda: 0)
    check_devices(cfg, cuda_count=lambda: 1)
    with pytest.raises(ConfigError, match=r"trainer\.strategy=dp asks for 1 GPU\(s\), but torch sees 0"):
        check_devices(compose_config("cluster=debug", "trainer.strategy=dp"), cuda_count=lambda: 0)
    cfg = compose_config("cluster.gpus_per_node=2")
    with pytest.raises(ConfigError, match=r"cluster\.gpus_per_node=2 asks for 2 GPU\(s\), but torch sees 1"):
        check_devices(cfg, cuda_count=lambda: 1)


def test_small_words_of_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_train.core.textutil import PROGRESS_TTY, at_step, plural, shows_progress_bar

    assert (plural(1, "rank"), plural(2, "rank")) == ("1 rank", "2 ranks")
    assert (at_step(7), at_step(None)) == ("at step 7", "(the script reported no step)")
    import io

    monkeypatch.delenv(PROGRESS_TTY, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # piped or a batch log: no carriage-return redraws
    assert not shows_progress_bar()
    monkeypatch.setenv(PROGRESS_TTY, "1")  # a local launcher on a terminal says so to its ranks
    assert shows_progress_bar()


def test_words_after_a_lone_dash_dash_become_one_script_args_override() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpc_train.cli import with_passthrough

    words = ["--tag", "a,b", "it's", "c:\\d", "e\\", "x y", "[z]", "--lr=1e-3"]
    argv = with_passthrough(["-m", "trainer.lr=1e-3,1e-2", "--", *words])
    assert argv[:2] == ["-m", "trainer.lr=1e-3,1e-2"] and len(argv) == 3  # a sweep keeps them for every element
    assert OverridesParser.create().parse_overrides([argv[2]])[0].value() == words
    with pytest.raises(ConfigError, match=r"script\.args is given twice"):
        with_passthrough(["script.args=[--x]", "--", "--y"])


def test_script_args_typed_in_a_shell_are_one_string_of_arguments(tmp_path: Path) -> None:
    """`hpc-train script.path=train.py script.args="--out x --lr=1e-3"`: the shell strips the quotes, and Hydra's
    grammar cannot read the = or a comma; the value is one string of arguments for the script, as written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpc_train.config import ScriptConfig, script_args_as_one_string

    typed = "--out x --lr=1e-3 --tags a,b --name it's"
    (arg,) = script_args_as_one_string([f"script.args={typed}"])
    value = OverridesParser.create().parse_overrides([arg])[0].value()
    assert value == typed and ScriptConfig(args="--out x --lr=1e-3 --tags a,b").argv[-1] == "a,b"
    kept = ["script.args=[--a,b]", "script.args='x y'", "script.args=choice('--a 1','--a 2')", "x=1", "script.args="]
    assert script_args_as_one_string(kept) == kept  # a list, a quoted string, a sweep, nothing: as written
    assert script_args_as_one_string(["+script.args=--b=2"]) == ["+script.args='--b=2'"]
    script = tmp_path / "train.py"
    script.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train", f"script.path={script}", "script.args=--out x --lr=1e-3,b", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "  args: --out x --lr=1e-3,b\n" in proc.stdout, proc.stdout


def test_options_picked_beyond_the_command_line_are_left_to_hydra(tmp_path: Path) -> None:
    from hpc_train.config import check_overrides

    check_overrides(["model=choice(mlp,cnn)", "model.channels=[8]"])  # a sweep function picks them
    check_overrides(["+experiment=quick", "model.width=3"])  # an experiment may pick its own model
    with pytest.raises(ConfigError, match=r"valid keys in model \(option mlp\)"):
        check_overrides(["model=mlp", "model.width=3"])


def test_a_target_whose_own_import_fails_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc_train.launch.preflight import check_targets

    (tmp_path / "needs_more.py").write_text("import no_such_dependency_here\nclass Net: ...\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    for module, said in [
        ("needs_more", r"importing needs_more failed: No module named 'no_such_dependency_here'\)\. HINT: fix"),
        ("raises", r"importing raises raised RuntimeError: boom\)"),
        ("nowhere", r"no module named 'nowhere'\)\. HINT: run from the folder"),
    ]:
        cfg = compose_config("model=custom", f"model._target_={module}.Net")
        with pytest.raises(ConfigError, match=said):
            check_targets(cfg)
