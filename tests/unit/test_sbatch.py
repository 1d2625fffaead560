"""The generated sbatch script: golden text, quoting that keeps hostile values inert, and the dry-run table."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from hpc_train.config import MANAGED_SBATCH_FLAGS, ClusterConfig
from hpc_train.core.errors import ConfigError
from hpc_train.launch.sbatch import emulate_rank_table, job_spec, render_sbatch

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
EXAMPLE = Path(__file__).resolve().parents[2] / "slurm" / "example.sbatch"
HOSTILE = "a$(touch x);`touch x`'q\"d"


def slurm(**overrides: object) -> ClusterConfig:
    """A Slurm cluster as a loaded config holds it: tasks_per_node=0 resolved to one task per GPU."""
    return ClusterConfig(launcher="slurm", **overrides).resolved()  # type: ignore[arg-type]


def golden_cluster() -> ClusterConfig:
    return slurm(
        nodes=2,
        tasks_per_node=4,
        gpus_per_node=4,
        cpus_per_task=8,
        mem="64G",
        timeout_min=90.5,
        partition="gpu",
        account="proj42",
        qos="high",
        constraint="a100&ib",
        exclude="node[07-08]",
        job_name="lr sweep",
        sbatch_args={"mail-type": "END", "exclusive": ""},
        setup=["module load cuda/12.4", "source /opt/venvs/train/bin/activate"],
        srun_args=["--cpu-bind=cores"],
        python="/opt/venvs/train/bin/python",
    )


RUN = "/scratch/me/outputs/2026-11-21/10-00-00.000000"


@pytest.mark.parametrize(
    ("name", "cluster", "run_dirs", "log_dir"),
    [
        # The committed example of slurm/README.md is this golden file.
        (EXAMPLE, golden_cluster(), [RUN], f"{RUN}/logs"),
        (
            "sbatch_array_cpu.sh",
            slurm(nodes=2, tasks_per_node=2, array_parallelism=2, python="/usr/bin/python3"),
            ["/s/multirun/0", "/s/multirun/1", "/s/multirun/2"],
            "/s/multirun/slurm",
        ),
    ],
)
def test_golden(name: str | Path, cluster: ClusterConfig, run_dirs: list[str], log_dir: str) -> None:
    """The exact text users read; regenerate with HPC_TRAIN_UPDATE_GOLDEN=1 after an intended change."""
    spec = job_spec(cluster, [Path(d) for d in run_dirs], Path(log_dir))
    text = render_sbatch(spec)
    path = GOLDEN / name
    if os.environ.get("HPC_TRAIN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_flags_are_sorted_and_sections_in_order() -> None:
    text = render_sbatch(job_spec(golden_cluster(), [Path("/r")], Path("/r/logs")))
    flags = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert flags == sorted(flags)
    sections = [line for line in text.splitlines() if line.startswith("# ---- ")]
    assert sections == ["# ---- parameters ----", "# ---- setup ----", "# ---- command ----", "# ---- teardown ----"]


def _fake_python(bin_dir: Path, exit_code: int) -> str:
    """A python that records its arguments (the supervisor's command line), one per line, and exits with
    ``exit_code``."""
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGS"\nexit {exit_code}\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return str(python)


@pytest.mark.parametrize("exit_code", [0, 3])
def test_hostile_values_stay_inert_and_exit_code_is_kept(tmp_path: Path, exit_code: int) -> None:
    run_dir = tmp_path / f"run {HOSTILE}"
    (run_dir / "logs").mkdir(parents=True)
    # Setup lines are shell as the user wrote it: a value they quoted prints as text, $HOME expands, && chains.
    # An unset variable is fine there too (conda's and Lmod's functions read some): `set -u` comes after.
    setup = [f"echo {shlex.quote(HOSTILE)}", 'echo "home=$HOME" && echo chained', 'echo "unset=$HPC_TRAIN_UNSET."']
    cluster = slurm(job_name=HOSTILE, setup=setup)
    python = _fake_python(tmp_path / f"bin {HOSTILE}", exit_code)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job_spec(cluster, [run_dir], run_dir / "logs", python=python)))
    env = {**os.environ, "SLURM_JOB_ID": "77", "ARGS": str(tmp_path / "args")}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == exit_code, proc.stderr
    assert not list(tmp_path.rglob("x")), "a quoted value was executed"
    assert proc.stdout.splitlines()[:4] == [HOSTILE, f"home={os.environ['HOME']}", "chained", "unset=."]
    args = (tmp_path / "args").read_text().splitlines()
    assert args == ["-u", "-m", "hpc_train.supervisor", "--run-dir", str(run_dir)]
    assert f'"exit_code": {exit_code}' in (run_dir / "status" / "batch_exit.json").read_text()


def test_array_script_picks_its_run_dir(tmp_path: Path) -> None:
    dirs = [tmp_path / f"{i} {HOSTILE}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    python = _fake_python(tmp_path / "bin", 0)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job_spec(slurm(), dirs, tmp_path, python=python)))
    env = {**os.environ, "SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "2", "ARGS": str(tmp_path / "args")}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
    assert (tmp_path / "args").read_text().splitlines()[-1] == str(dirs[2])
    assert "#SBATCH --array=0-2" in script.read_text()


def test_emulated_rank_table_two_by_two() -> None:
    rows = emulate_rank_table(slurm(nodes=2, tasks_per_node=2))
    assert [(r["rank"], r["node"], r["local_rank"]) for r in rows] == [
        (0, "node1", 0),
        (1, "node1", 1),
        (2, "node2", 0),
        (3, "node2", 1),
    ]
    assert len({r["master"] for r in rows}) == 1 and str(rows[0]["master"]).startswith("node1:")


@pytest.mark.parametrize(("binding", "expected"), [("task", ["0", "1", "0", "1"]), ("node", ["0,1"] * 4)])
def test_emulated_cuda_visible_devices(binding: str, expected: list[str]) -> None:
    rows = emulate_rank_table(slurm(nodes=2, tasks_per_node=2, gpus_per_node=2, gpu_binding=binding))
    assert [r["CUDA_VISIBLE_DEVICES"] for r in rows] == expected


def test_gpu_flags() -> None:
    per_task = job_spec(slurm(gpus_per_node=4, gpu_binding="task"), [Path("/r")], Path("/r")).flags
    per_node = job_spec(slurm(gpus_per_node=4), [Path("/r")], Path("/r")).flags
    assert per_task["gpus-per-task"] == "1" and "gpus-per-node" not in per_task
    assert per_node["gpus-per-node"] == "4" and per_node["ntasks-per-node"] == "4"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sbatch_args": {"nodes": "3"}}, r"--nodes is set by hpc_train.*HINT: use cluster\.nodes"),
        ({"sbatch_args": {"--mail-type": "END"}}, r"not an sbatch flag name"),
        ({"mem": "lots"}, r"cluster\.slurm\.mem='lots' is invalid"),
        ({"gpus_per_node": 2, "tasks_per_node": 4}, r"4 tasks per node would share 2 GPUs"),
        ({"gpu_binding": "task"}, r"per-task binding"),
        ({"signal": "USR3"}, r"cluster\.signal='USR3'"),
        ({"setup": ["echo 'unbalanced"]}, r"cannot split .*balance the quotes"),
        ({"signal_lead_s": 7200, "timeout_min": 60}, r"shorter than the time limit"),
        ({"submit": "qsub"}, r"cluster\.slurm\.submit='qsub'"),
    ],
)
def test_slurm_rules(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        slurm(**overrides)


def test_tasks_per_node_defaults_to_gpus() -> None:
    assert slurm(gpus_per_node=8).tasks_per_node == 8
    assert slurm().tasks_per_node == 1


def test_slurm_keys_on_local_launcher_warn() -> None:
    with pytest.warns(UserWarning, match=r"cluster\.slurm\.partition is ignored by cluster\.launcher=local"):
        ClusterConfig(launcher="local", partition="gpu")


def test_sweep_elements_must_share_one_request() -> None:
    from hpc_train.config import Config, MLPConfig, SGDConfig
    from hpc_train.launch.sweep import _check_one_request

    def job(nodes: int) -> Config:
        return Config(cluster=slurm(nodes=nodes), model=MLPConfig(), optim=SGDConfig())

    _check_one_request([job(2), job(2)])
    with pytest.raises(ConfigError, match=r"sweep element 1 has cluster\.nodes=3 but element 0 has 2"):
        _check_one_request([job(2), job(3)])


@pytest.mark.parametrize("binding", ["node", "task"])
def test_every_flag_hpc_train_writes_is_one_sbatch_args_may_not_set(binding: str) -> None:
    """MANAGED_SBATCH_FLAGS is what cluster.sbatch_args is refused; a flag the script writes and the table
    lacks could be given twice, with the user's value silently winning or losing."""
    cluster = golden_cluster()
    cluster.gpu_binding = binding
    spec = job_spec(cluster, [Path("/r/0"), Path("/r/1")], Path("/r"))
    lines = render_sbatch(spec).splitlines()
    written = {line.removeprefix("#SBATCH --").split("=")[0] for line in lines if line.startswith("#SBATCH --")}
    assert {"nodes", "signal", "array", "output"} <= written  # the parse found the flags
    assert written - set(cluster.sbatch_args) - set(MANAGED_SBATCH_FLAGS) == set()


# Every key whose value reaches an #SBATCH line, an srun argument or the command, each given a newline payload
# through a cluster profile file (as a shared profile would). Bash reads `#SBATCH --job-name='x` as a comment,
# quote included, so without the check the next line would run on the compute node.
PAYLOAD = "x\ntouch /tmp/hpc_train_pwned #"
QUOTED = json.dumps(PAYLOAD)  # a double-quoted YAML scalar: \n is a newline there
INJECTIONS = {
    "job_name": f"job_name: {QUOTED}",
    "partition": f"partition: {QUOTED}",
    "account": f"account: {QUOTED}",
    "qos": f"qos: {QUOTED}",
    "constraint": f"constraint: {QUOTED}",
    "exclude": f"exclude: {QUOTED}",
    "mem": f"mem: {QUOTED}",
    "python": f"python: {QUOTED}",
    "signal": 'signal: "USR2\\t"',
    "sbatch_args.mail-type": f"sbatch_args: {{mail-type: {QUOTED}}}",
    "sbatch_args{'mail-type\\n#SBATCH --time=9999'}": 'sbatch_args: {"mail-type\\n#SBATCH --time=9999": END}',
    "srun_args[1]": f"srun_args: [--cpu-bind=cores, {QUOTED}]",
    "container": f"container: {QUOTED}",
}


@pytest.mark.parametrize("nested", [True, False], ids=["slurm.key", "old flat key"])
@pytest.mark.parametrize("key", sorted(INJECTIONS))
def test_a_profile_cannot_inject_a_command(tmp_path: Path, key: str, nested: bool) -> None:
    """Under cluster.slurm, or under the old flat names that profiles written before it still use."""
    from hpc_train.tools.api import compose_config

    profile = tmp_path / "conf" / "cluster"
    profile.mkdir(parents=True)
    line = INJECTIONS[key]
    slurm_key = key != "signal"
    if nested and slurm_key:
        line = f"slurm:\n  {line}"
    (profile / "shared.yaml").write_text(f"defaults: [slurm]\n{line}\n")
    where = f"slurm.{key}" if slurm_key else key
    with pytest.raises(ConfigError, match=rf"cluster\.{re.escape(where)} holds the control character"):
        compose_config("cluster=shared", config_dir=tmp_path / "conf")


@pytest.mark.parametrize("key", ["path", "module", "args[1]"])
def test_script_values_cannot_carry_a_newline(tmp_path: Path, key: str) -> None:
    from hpc_train.config import ScriptConfig

    values = {"path": {"path": PAYLOAD}, "module": {"module": PAYLOAD}, "args[1]": {"args": ["--ok", PAYLOAD]}}
    with pytest.raises(ConfigError, match=rf"script\.{re.escape(key)} holds the control character '\\n'"):
        ScriptConfig(**values[key])  # type: ignore[arg-type]


def test_parameter_section_holds_only_sbatch_lines(tmp_path: Path) -> None:
    text = render_sbatch(job_spec(golden_cluster(), [Path("/r")], Path("/r/logs")))
    section = text.split("# ---- parameters ----\n", 1)[1].split("\n\n", 1)[0]
    assert all(line.startswith("#SBATCH --") for line in section.splitlines()), section
    # Past validation (a spec built by hand), the renderer itself refuses a payload in a flag's value or name.
    import dataclasses

    spec = job_spec(golden_cluster(), [Path("/r")], Path("/r/logs"))
    for flags in ({**spec.flags, "job-name": PAYLOAD}, {**spec.flags, "mail-type\n#SBATCH --time=9999": "END"}):
        with pytest.raises(ConfigError, match=r"control character"):
            render_sbatch(dataclasses.replace(spec, flags=flags))
    # What is not config (the run dir in --output) is refused at render time too.
    with pytest.raises(ConfigError, match=r"--output=.*control character.*hydra\.run\.dir"):
        render_sbatch(job_spec(golden_cluster(), [Path("/r")], Path(f"/r/{PAYLOAD}")))


def test_container_wraps_the_batch_step_and_every_training_step(tmp_path: Path) -> None:
    from hpc_train.core.rundir import RunDir
    from hpc_train.runtime.supervisor import step_argv

    cluster = slurm(container="apptainer exec --nv '/images/my train.sif'", python="/opt/conda/bin/python")
    text = render_sbatch(job_spec(cluster, [Path("/r")], Path("/r/logs")))
    assert "apptainer exec --nv '/images/my train.sif' /opt/conda/bin/python -u -m hpc_train.supervisor" in text
    argv = step_argv(RunDir(tmp_path), cluster, ["node1"], cluster.python)
    wrapper = ["apptainer", "exec", "--nv", "/images/my train.sif", "/opt/conda/bin/python", "-u", "-m"]
    start = argv.index("apptainer")
    assert argv[start : start + len(wrapper)] == wrapper


def test_a_wrapper_in_python_points_to_cluster_container() -> None:
    with pytest.raises(
        ConfigError, match=r"cluster\.slurm\.python=.*HINT:.*cluster\.slurm\.container='apptainer exec --nv img\.sif'"
    ):
        slurm(python="apptainer exec --nv img.sif python")


def test_submit_here_needs_an_allocation_that_fits() -> None:
    from hpc_train.launch.here import allocation_nodes, inside_allocation
    from hpc_train.tools.api import compose_config

    cfg = compose_config("cluster=slurm", "cluster.submit=here", "cluster.nodes=2")
    salloc = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]"}
    assert inside_allocation(salloc) and not inside_allocation({**salloc, "SLURM_STEP_ID": "0"})
    assert allocation_nodes(cfg, salloc) == ["node1", "node2", "node3"]
    with pytest.raises(ConfigError, match=r"outside any Slurm allocation\. HINT: run it in the shell that `salloc"):
        allocation_nodes(cfg, {})
    with pytest.raises(ConfigError, match=r"inside a job step \(srun\)"):
        allocation_nodes(cfg, {**salloc, "SLURM_STEP_ID": "3"})
    with pytest.raises(ConfigError, match=r"needs 2 nodes, but allocation 42 holds 1 \(node1\)\. HINT: set cluster"):
        allocation_nodes(cfg, {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1"})


def test_a_python_path_with_a_space_is_one_executable(tmp_path: Path) -> None:
    python = tmp_path / "J Doe" / "python"
    python.parent.mkdir()
    python.touch()
    assert slurm(python=str(python)).python == str(python)


def test_the_supervisor_is_told_each_run_dirs_mirror_quoted(tmp_path: Path) -> None:
    """The mirror reaches the supervisor from the script, not from the run dir (a scratch purge may empty that)."""
    dirs = [tmp_path / f"{i} {HOSTILE}" for i in range(2)]
    mirrors = [f"/mirrors/{i} {HOSTILE}" for i in range(2)]
    for d in dirs:
        d.mkdir()
    python = _fake_python(tmp_path / "bin", 0)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job_spec(slurm(), dirs, tmp_path, python=python, mirrors=mirrors)))
    env = {**os.environ, "SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "1", "ARGS": str(tmp_path / "args")}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
    assert (tmp_path / "args").read_text().splitlines()[-3:] == [str(dirs[1]), "--mirror", mirrors[1]]
    assert not list(tmp_path.rglob("x")), "a quoted value was executed"

    script.write_text(render_sbatch(job_spec(slurm(), dirs[:1], tmp_path, python=python, mirrors=mirrors[:1])))
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
    assert (tmp_path / "args").read_text().splitlines()[-3:] == [str(dirs[0]), "--mirror", mirrors[0]]
    assert "--mirror" not in render_sbatch(job_spec(slurm(), dirs[:1], tmp_path, python=python, mirrors=[""]))
    with pytest.raises(ConfigError, match="control character"):
        render_sbatch(job_spec(slurm(), dirs[:1], tmp_path, python=python, mirrors=["/m\n$(touch x)"]))
