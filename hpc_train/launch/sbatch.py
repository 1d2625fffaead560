"""The sbatch side, pure: config in, flags and script text out. Nothing here runs a command.

The script has four fixed sections (parameters / setup / command / teardown), sorted ``#SBATCH`` flags and every
value shell-quoted: sbatch reads ``#SBATCH`` lines with shell quoting, so quoting keeps a job name or path
intact and inert. Each task runs ``python -m hpc_train.worker --run-dir RUN_DIR``, so ranks resolve from the
SLURM_* variables of the step and no pickle is needed.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_train.config import ClusterConfig, control_character
from hpc_train.config.sizes import mem_mb
from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import BATCH_EXIT
from hpc_train.core.textutil import format_table
from hpc_train.distributed import resolve_environment
from hpc_train.runtime.commands import SUPERVISOR, WORKER, srun_argv
from hpc_train.runtime.timeouts import AUTO_DEFAULT_LEAD_S

__all__ = [
    "JobSpec",
    "emulate_rank_table",
    "format_emulated_table",
    "job_spec",
    "render_sbatch",
    "sbatch_flags",
    "setup_lines",
    "srun_argv",
]

EXAMPLE_JOB_ID = 12345


def sbatch_flags(cluster: ClusterConfig, pack: int = 1, lead_s: int | None = None) -> dict[str, str | None]:
    """The resource flags of one job (or of each array element); None marks a flag without a value. ``pack``:
    the runs that share the job (``cluster.pack``), each with ``cluster``'s tasks, GPUs and memory per node.
    ``lead_s``: the signal lead (``runtime.timeouts.derive_lead``; None: the one the config sets, or with
    ``auto`` the default for a run with nothing measured)."""
    if lead_s is None:
        lead_s = cluster.slurm.fixed_lead_s if not cluster.slurm.lead_auto else None
    flags: dict[str, str | None] = {
        # Training nodes and spares, or the range from cluster.min_nodes: the supervisor picks among what it gets.
        "nodes": cluster.nodes_request,
        "ntasks-per-node": str(cluster.tasks_per_node * pack),
        "cpus-per-task": str(cluster.cpus_per_task),
        "time": str(math.ceil(cluster.timeout_min)),
        "job-name": cluster.slurm.job_name,
        # Steps only (no "B:"): the ranks checkpoint; the batch shell traps the signal and waits for them.
        "signal": f"{cluster.signal.upper().removeprefix('SIG')}@{AUTO_DEFAULT_LEAD_S if lead_s is None else lead_s}",
        # The ranks requeue the job after checkpointing on that signal; some sites default to --no-requeue.
        "requeue": None,
    }
    if cluster.asks_range:
        # Slurm fixes a job's task count when it starts (nodes x --ntasks-per-node) and keeps it when the job is
        # requeued, so a requeued range job would come back on no more nodes than it first got (measured on
        # 22.05: scontrol update cannot clear it). A range job asks for each node's CPUs as one task's instead;
        # the supervisor's srun gives each training step its tasks (--ntasks-per-node, --cpus-per-task).
        del flags["ntasks-per-node"]
        flags["cpus-per-task"] = str(cluster.tasks_per_node * cluster.cpus_per_task)
    if cluster.slurm.spare_nodes or cluster.asks_range:
        # A lost node must not end the allocation: the supervisor goes on with a spare, or on fewer nodes
        # (cluster.min_nodes). Otherwise Slurm's default stays (the job ends on a node failure, and is requeued
        # onto healthy nodes).
        flags["no-kill"] = None
    if cluster.gpus_per_node and cluster.slurm.gpu_binding == "task":
        flags["gpus-per-task"] = "1"
    elif cluster.gpus_per_node:
        flags["gpus-per-node"] = str(cluster.gpus_per_node * pack)
    for key in ("partition", "account", "qos", "constraint", "exclude", "mem"):
        value = getattr(cluster, key)
        if value:
            flags[key] = value
    if pack > 1 and mem_mb(cluster.slurm.mem or "0"):  # (0 asks for all of each node's memory, for any pack)
        flags["mem"] = f"{mem_mb(cluster.slurm.mem) * pack}M"
    flags.update({k: (v if v != "" else None) for k, v in cluster.slurm.sbatch_args.items()})
    return flags


def setup_lines(cluster: ClusterConfig) -> list[str]:
    """The setup lines exactly as the user wrote them: shell code from their own config, like submitit's
    ``setup`` and NeMo-Run's ``setup_lines`` (``source $HOME/venv/bin/activate``, ``module load a && module
    load b``). Everything else that reaches the script (job name, paths, srun arguments, sbatch values) is
    quoted."""
    return list(cluster.slurm.setup)


@dataclass(frozen=True)
class JobSpec:
    """One submission: a job, or an array whose element i trains in ``run_dirs[i]``."""

    flags: dict[str, str | None]
    setup: list[str]
    python: str
    run_dirs: list[Path]
    output: str
    """Slurm's --output pattern (stdout and stderr of the batch script and srun)."""
    signal: str
    array_parallelism: int = 0
    wrapper: tuple[str, ...] = ()
    """cluster.slurm.container's words, put before the Python."""
    pack: int = 1
    """Run dirs per job (``cluster.pack``): element i trains ``run_dirs[i * pack : (i + 1) * pack]``."""
    mirrors: tuple[str, ...] = ()
    """Each run dir's trainer.mirror ('' for none; empty: none has one): the supervisor brings a run dir that lost
    its config.yaml back from it (a scratch purge while the job was queued). Not for packs."""

    @property
    def python_command(self) -> list[str]:
        """The wrapper (if any) and the Python that runs the batch step."""
        return [*self.wrapper, self.python]

    @property
    def jobs(self) -> int:
        """Jobs (array elements) submitted: one per pack of run dirs."""
        return -(-len(self.run_dirs) // self.pack)

    @property
    def is_array(self) -> bool:
        return self.jobs > 1

    @property
    def packed(self) -> bool:
        return self.pack > 1


def job_spec(
    cluster: ClusterConfig,
    run_dirs: Sequence[Path],
    log_dir: Path,
    python: str | None = None,
    pack: int = 1,
    lead_s: int | None = None,
    mirrors: Sequence[str] = (),
) -> JobSpec:
    """The spec for ``run_dirs`` (several: an array, of packs of ``pack``); Slurm writes its output under
    ``log_dir``; ``lead_s``: the signal lead (``sbatch_flags``); ``mirrors``: each run dir's trainer.mirror."""
    pack = max(1, min(pack, len(run_dirs)))  # a sweep of fewer points than cluster.pack asks for those only
    name = "slurm-%A_%a.out" if len(run_dirs) > pack else "slurm-%j.out"
    return JobSpec(
        pack=pack,
        flags=sbatch_flags(cluster, pack, lead_s),
        setup=setup_lines(cluster),
        python=python or cluster.slurm.python or sys.executable,
        run_dirs=[Path(d) for d in run_dirs],
        output=str(log_dir / name),
        signal=cluster.signal.upper().removeprefix("SIG"),
        array_parallelism=cluster.slurm.array_parallelism,
        wrapper=tuple(cluster.container_argv),
        mirrors=tuple(mirrors) if any(mirrors) and pack == 1 else (),
    )


def _check_one_line(key: str, values: Sequence[str]) -> None:
    """Refuse ``values`` for the script's command when one holds a control character (validation refuses those
    in every config value already: this guards what reaches the script by another way)."""
    for value in values:
        if control_character(value):
            raise ConfigError(
                f"{key}={value!r} holds a control character, which a job script must not carry. HINT: remove it"
            )


def _flag_line(key: str, value: str | None) -> str:
    # Validation refuses control characters in every config value; this also covers what is not config (the
    # run dir in --output). A newline here would end the #SBATCH comment and start a command.
    for text in (key, value or ""):
        if control_character(text):
            raise ConfigError(
                f"sbatch flag --{key}={value!r} holds a control character, which would run as a shell command in "
                "the job script. HINT: remove it; if it comes from hydra.run.dir or hydra.sweep.dir, choose a "
                "folder name without newlines or tabs."
            )
    return f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={shlex.quote(value)}"


def render_sbatch(spec: JobSpec) -> str:
    """The standalone sbatch script for ``spec``."""
    _check_one_line("trainer.mirror", spec.mirrors)
    flags = dict(spec.flags)
    flags["output"] = spec.output
    flags["open-mode"] = "append"  # a requeued job adds to its log instead of truncating it
    if spec.is_array:
        limit = f"%{spec.array_parallelism}" if spec.array_parallelism else ""
        flags["array"] = f"0-{spec.jobs - 1}{limit}"
    lines = [
        "#!/bin/bash",
        "# Generated by hpc_train. Readable and editable: resubmit with `sbatch <this file>`.",
        "",
        "# ---- parameters ----",
        *(_flag_line(k, flags[k]) for k in sorted(flags)),
        "",
        "# ---- setup ----",
    ]
    if spec.packed:
        lines.append("RUN_DIRS=(" + " ".join(shlex.quote(str(d)) for d in spec.run_dirs) + ")")
        first = "$((SLURM_ARRAY_TASK_ID * PACK))" if spec.is_array else "0"
        lines += [f"PACK={spec.pack}", f'MEMBERS=("${{RUN_DIRS[@]:{first}:PACK}}")']
    elif spec.is_array:
        lines.append("RUN_DIRS=(" + " ".join(shlex.quote(str(d)) for d in spec.run_dirs) + ")")
        lines.append("RUN_DIR=${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}")
        if spec.mirrors:
            lines.append("MIRRORS=(" + " ".join(shlex.quote(m) for m in spec.mirrors) + ")")
    else:
        lines.append(f"RUN_DIR={shlex.quote(str(spec.run_dirs[0]))}")
    if spec.setup:
        # Before `set -u`: conda's and Lmod's shell functions read variables that may be unset.
        lines += ["# cluster.slurm.setup, as written (shell)", *spec.setup]
    lines.append("set -u")
    if spec.packed:
        command = shlex.join([*spec.python_command, "-u", "-m", SUPERVISOR, "--pack"]) + ' "${MEMBERS[@]}"'
        about = [
            "# The pack's supervisor runs one supervisor per run dir, side by side: each runs its training step",
            f"# (srun --exact ... python -m {WORKER}) on its share of the allocation, and starts it again after a",
            "# failure worth retrying; the job is requeued once, after every member stopped (docs/slurm.md).",
        ]
    else:
        command = shlex.join([*spec.python_command, "-u", "-m", SUPERVISOR, "--run-dir"]) + ' "$RUN_DIR"'
        if spec.mirrors:  # read from here, not from the run dir: a scratch purge may have emptied that
            mirror = '"${MIRRORS[$SLURM_ARRAY_TASK_ID]}"' if spec.is_array else shlex.quote(spec.mirrors[0])
            command += f" --mirror {mirror}"
        about = [
            f"# The supervisor runs the training step (srun ... python -m {WORKER}) on the healthy nodes, and starts",
            "# it again in this allocation after a failure worth retrying (the manual: docs/recovery.md).",
        ]
    lines += [
        "",
        "# ---- command ----",
        *about,
        f"# Slurm sends SIG{spec.signal} to the ranks before the time limit; `scancel --full` would also send it",
        "# here, where bash would die of it and lose the exit status. So this shell only notes it and keeps waiting.",
        f"trap 'echo \"hpc_train: batch shell got SIG{spec.signal}; the ranks handle it\" >&2' {spec.signal}",
        f"{command} &",
        "supervisor_pid=$!",
        'while kill -0 "$supervisor_pid" 2>/dev/null; do wait "$supervisor_pid"; done',
        'wait "$supervisor_pid"',
        "rc=$?",
        "",
        "# ---- teardown ----",
        *([] if spec.packed else _batch_exit_lines()),
        'echo "hpc_train: the supervisor exited with status $rc"',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def _batch_exit_lines() -> list[str]:
    """The teardown's record of the supervisor's exit status (a pack's supervisor writes each member's own)."""
    return [
        f'mkdir -p "$RUN_DIR/{Path(BATCH_EXIT).parent}"',
        'printf \'{"job_id": "%s", "exit_code": %d, "end": %d}\\n\' "$SLURM_JOB_ID" "$rc" "$(date +%s)" '
        f'> "$RUN_DIR/{BATCH_EXIT}"',
    ]


def emulate_rank_table(cluster: ClusterConfig, job_id: int = EXAMPLE_JOB_ID) -> list[dict[str, str | int]]:
    """What each rank of the requested shape will resolve, by running ``resolve_environment`` on the variables
    srun would set. Node names are placeholders: Slurm picks the real ones at allocation."""
    nodes, per_node = cluster.nodes, cluster.tasks_per_node
    nodelist = f"node[1-{nodes}]" if nodes > 1 else "node1"
    rows: list[dict[str, str | int]] = []
    for rank in range(nodes * per_node):
        node, local = divmod(rank, per_node)
        environ = {
            "SLURM_JOB_ID": str(job_id),
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(node),
            "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
            "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
            "SLURMD_NODENAME": f"node{node + 1}",
        }
        env = resolve_environment(environ)
        if cluster.gpus_per_node and cluster.slurm.gpu_binding == "task":
            visible = str(local)
        else:
            visible = ",".join(str(g) for g in range(cluster.gpus_per_node))
        rows.append(
            {
                "rank": env.rank,
                "node": env.hostname,
                "local_rank": env.local_rank,
                "master": f"{env.master_addr}:{env.master_port}",
                "CUDA_VISIBLE_DEVICES": visible or "(none: CPU)",
            }
        )
    return rows


def format_emulated_table(rows: list[dict[str, str | int]]) -> str:
    return format_table(list(rows[0]), [list(r.values()) for r in rows])
