"""Typed config schema: the defaults and rules live here; ``conf/*.yaml`` (``pkg://hpc_train.conf``) picks options.

Every dataclass checks its own fields in ``__post_init__`` and raises ``ConfigError`` naming the key, the
value and the fix; ``Config.__post_init__`` checks rules that span groups. ``OmegaConf.to_object`` runs these
checks, so a bad value stops ``python -m hpc_train`` before anything is launched.

Groups whose options have different fields (``model``, ``optim``) get one schema per option, chosen by the
option's ``name`` (see ``MODEL_SCHEMAS`` / ``OPTIM_SCHEMAS``); ``config_from_dict`` uses the same tables to
rebuild a typed config from the ``config.yaml`` saved in a run directory.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import MISSING as MISSING_FACTORY
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf

from hpc_train.core.errors import ConfigError

__all__ = [
    "CONFIG_MODULE",
    "FLOAT32_MAX",
    "INT32_MAX",
    "INT64_MAX",
    "MODEL_SCHEMAS",
    "OPTIM_SCHEMAS",
    "RESUME_SAFE_KEYS",
    "SLURM_U16_MAX",
    "STOP_SIGNALS",
    "YEAR_MIN",
    "YEAR_S",
    "AdamWConfig",
    "CNNConfig",
    "ClusterConfig",
    "Config",
    "DDPConfig",
    "DataConfig",
    "EarlyStoppingConfig",
    "MLPConfig",
    "SGDConfig",
    "ScheduleConfig",
    "ScriptConfig",
    "TrainerConfig",
    "TransformerConfig",
    "check_override_keys",
    "check_override_syntax",
    "check_overrides",
    "chosen_option_keys",
    "config_from_dict",
    "control_character",
    "environment_keys",
    "hydra_quoted",
    "load_config",
    "mem_mb",
    "override_keys",
    "register_configs",
]


CONFIG_MODULE = "pkg://hpc_train.conf"
"""Where hpc_train's own YAML configs are: inside the package, so an installed wheel finds them from any folder."""

STOP_SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP")
"""What ``cluster.signal`` may be: signals that sbatch's --signal knows by name and a rank can catch as a notice to
checkpoint and stop. Slurm's other names are refused: KILL and STOP cannot be caught; TSTP, TTIN, TTOU and CONT
stop or resume a process, URG comes with a socket's urgent data, ABRT reports a crash, and ALRM belongs to
timers in user code, so treating any of them as a stop request would be wrong."""
_UNCATCHABLE = ("KILL", "STOP")

INT32_MAX = 2**31 - 1
"""The largest C int: torch's ranks and world size, thread and process counts, Slurm's 32-bit counts."""
INT64_MAX = 2**63 - 1
"""The largest int64: step and sample counts (torch tensors and checkpoints hold them as int64)."""
SLURM_U16_MAX = 0xFFFD
"""Slurm keeps CPUs per task and tasks per node in 16 bits, with 0xFFFE and 0xFFFF as its own markers."""
YEAR_S = 365 * 24 * 3600
"""The longest timeout in seconds (365 days): well inside what timedelta, threading and faulthandler take."""
YEAR_MIN = YEAR_S // 60
FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a hyper-parameter beyond it (a learning rate, a weight decay) turns float32 tensors to inf."""
_F32 = "the largest float32"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character(value: Any) -> tuple[str, str] | None:
    """The first control character (newline, tab, escape, ...) anywhere in a string, list or mapping, as
    (where, the character's repr), or None. ``where`` is ``""`` for the value itself, ``[2]`` for a list item,
    ``.key`` for a mapping value and ``{key}`` for a mapping key."""
    if isinstance(value, str):
        found = _CONTROL.search(value)
        return ("", repr(found[0])) if found else None
    if isinstance(value, Mapping | DictConfig):
        for key, item in value.items():
            hit = control_character(str(key))
            if hit:
                return f"{{{key!r}}}", hit[1]
            hit = control_character(item)
            if hit:
                return f".{key}{hit[0]}", hit[1]
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            hit = control_character(item)
            if hit:
                return f"[{i}]{hit[0]}", hit[1]
    return None


class _Checked:
    """Mixin: ``self._require(ok, field, rule, hint)`` raises a ConfigError naming ``<group>.<field>``."""

    _group: ClassVar[str]
    _raw_shell: ClassVar[tuple[str, ...]] = ()
    """Fields that are never written into a script or command (or are raw shell by design): not checked for
    control characters."""

    def _refuse_control_characters(self) -> None:
        """No value may carry a newline or another control character into a generated script: bash reads an
        ``#SBATCH`` line as a comment, quotes and all, so a newline in a value starts a command of its own."""
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in self._raw_shell:
                continue
            hit = control_character(getattr(self, f.name))
            if hit:
                where, char = hit
                raise ConfigError(
                    f"{self._group}.{f.name}{where} holds the control character {char}, which would let the value "
                    f"run as a shell command in the job script. HINT: remove it from the value (look in the profile "
                    f"or experiment file that sets it); only cluster.setup lines may hold shell code."
                )

    def _require(self, ok: bool, key: str, rule: str, hint: str) -> None:
        if not ok:
            value = getattr(self, key)
            raise ConfigError(f"{self._group}.{key}={value!r} is invalid: {rule}. HINT: {hint}")

    def _bounded(
        self, key: str, low: float, high: float, example: object, *, above: bool = False, why: str = ""
    ) -> None:
        """``<group>.<key>`` is a finite number from ``low`` (more than ``low`` when ``above``) to ``high``, so that
        it fits where it goes (a seed into torch's generators, seconds into a timedelta, a count into a C int)
        instead of failing on every rank after launch. Whole-number bounds word the rule for an integer key;
        ``why`` says where ``high`` comes from; ``example`` is the value the hint suggests."""
        value = getattr(self, key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        finite = number and (isinstance(value, int) or math.isfinite(value))  # (an int may be too big for a float)
        if finite and (value > low if above else value >= low) and value <= high:
            return
        note = f" ({why})" if why else ""
        if isinstance(low, int) and isinstance(high, int):
            rule = f"must be a whole number from {low} to {high}{note}"
        else:
            rule = f"must be a finite number {'above' if above else 'from'} {_plain(low)} "
            rule += f"{'and at most' if above else 'to'} {_plain(high)}{note}"
        self._require(False, key, rule, f"e.g. {self._group}.{key}={example}")

    def _one_of(self, key: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, key)
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self._require(
            value in choices,
            key,
            f"must be one of {', '.join(choices)}",
            f"{hint}e.g. {self._group}.{key}={choices[0]}",
        )


def _plain(number: float) -> str:
    """A bound as people write it: 31536000, not 3.1536e+07; 0.5 stays 0.5."""
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else f"{number:g}"


LAUNCHERS = ("local", "debug", "slurm")


def _shell_words(text: str) -> list[str]:
    """``text`` split like a shell would; [] when it cannot be (unbalanced quotes)."""
    try:
        return shlex.split(text)
    except ValueError:
        return []


def mem_mb(value: str) -> int:
    """A ``cluster.mem`` size (``500M``, ``64G``, ``1T``, a plain number = MB) in MB; 0 asks for all of a node's.
    ValueError when it is not a size: the one grammar both validation and the cluster checks read."""
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", value, flags=re.I)
    if match is None:
        raise ValueError(f"not a memory size: {value!r}")
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[match[2].upper()]
    return math.ceil(int(match[1]) * scale)


def _is_mem_size(value: str) -> bool:
    try:
        mem_mb(value)
    except ValueError:
        return False
    return True


HOSTLIST_KEYS = ("exclude",)
"""ClusterConfig keys that hold a Slurm hostlist (checked with the same parser rank resolution uses)."""
SUBMIT_MODES = ("submitit", "sbatch", "here")
GPU_BINDINGS = ("node", "task")
# sbatch flags hpc_train sets itself from the keys named here (or refuses: ntasks, gres, error, wrap);
# cluster.sbatch_args may not set them. tests/unit/test_sbatch.py checks that every flag the renderer writes
# is here.
MANAGED_SBATCH_FLAGS = {
    "nodes": "cluster.nodes",
    "ntasks": "cluster.nodes and cluster.tasks_per_node",
    "ntasks-per-node": "cluster.tasks_per_node",
    "cpus-per-task": "cluster.cpus_per_task",
    "gpus-per-node": "cluster.gpus_per_node",
    "gpus-per-task": "cluster.gpu_binding=task",
    "gres": "cluster.gpus_per_node",
    "mem": "cluster.mem",
    "time": "cluster.timeout_min",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "constraint": "cluster.constraint",
    "exclude": "cluster.exclude",
    "job-name": "cluster.job_name",
    "signal": "cluster.signal and cluster.signal_lead_s",
    "requeue": "cluster.max_restarts (hpc_train requeues after the preemption signal)",
    "array": "a multirun (-m) sweep",
    "output": "the run directory",
    "error": "the run directory",
    "open-mode": "the run directory",
    "wrap": "the generated script",
}
_SLURM_ONLY = (
    "submit",
    "dry_run",
    "wait",
    "partition",
    "account",
    "qos",
    "constraint",
    "exclude",
    "mem",
    "gpu_binding",
    "sbatch_args",
    "setup",
    "srun_args",
    "python",
    "container",
    "array_parallelism",
    "job_name",
    "srun_wait_s",
    "signal_lead_s",
    "max_restarts",
    "max_stalled_restarts",
    "spare_nodes",
    "max_failures",
    "max_stalled_failures",
)
"""Keys only a Slurm job uses: set on a local or debug run, they are ignored with a warning."""


@dataclass
class ClusterConfig(_Checked):
    """Where and how wide the job runs, and (for Slurm) what to ask the scheduler for."""

    _group: ClassVar[str] = "cluster"
    _raw_shell: ClassVar[tuple[str, ...]] = ("setup", "facts")

    launcher: str = "local"
    """local: processes here via submitit's LocalExecutor; debug: this process (pdb works); slurm: a Slurm job."""
    nodes: int = 1
    """Number of nodes."""
    tasks_per_node: int = 0
    """Processes (ranks) per node; 0 picks gpus_per_node on GPU jobs and 1 on CPU jobs."""
    gpus_per_node: int = 0
    """GPUs per node; 0 runs on CPU with gloo."""
    cpus_per_task: int = 1
    """CPU cores per rank; also the number of torch threads each rank uses. A local or debug run may ask for at
    most the cores this machine lets it use (checked before launch)."""
    timeout_min: float = 60.0
    """Wall-clock limit of the job (Slurm's --time, rounded up to whole minutes); the job is ended after it."""
    failure_grace_s: float = 15.0
    """After one rank fails, how long the others get to exit on their own before they are killed."""
    # ---- Slurm only ----
    submit: str = "submitit"
    """submitit: through submitit's SlurmExecutor; sbatch: a standalone script in the run dir, submitted with
    sbatch; here: no new job, train in the allocation this shell holds (salloc), with srun on its nodes."""
    dry_run: bool = False
    """Write and print the sbatch script and the expected rank table; submit nothing."""
    wait: bool = False
    """Follow rank 0's log until the job ends and exit with its outcome (default: print the job id and return)."""
    partition: str = ""
    """Slurm partition ('' = the cluster's default)."""
    account: str = ""
    """Account to charge ('' = your default)."""
    qos: str = ""
    """Quality of service ('' = default)."""
    constraint: str = ""
    """Node features required, e.g. 'a100&ib' ('' = none)."""
    exclude: str = ""
    """Nodes to avoid, as a hostlist ('' = none)."""
    mem: str = ""
    """Memory per node, e.g. '64G'; '0' asks for all of it ('' = the cluster's default)."""
    job_name: str = "hpc_train"
    """Job name shown by squeue."""
    gpu_binding: str = "node"
    """node: every task sees all GPUs of its node and takes cuda:<local rank>; task: one GPU per task (--gpus-per-task=1)."""
    sbatch_args: dict[str, str] = field(default_factory=dict)
    """Extra sbatch flags without the dashes, e.g. {mail-type: END}; '' as a value gives a bare flag."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before srun, as written: 'source $HOME/venvs/train/bin/activate', 'module load cuda/12.4
    && module load nccl', 'export DATA=$SCRATCH/imagenet', 'conda activate train'. They are your own shell code,
    so $VARS expand and && or pipes work; hpc_train quotes every other value it writes into the script."""
    python: str = ""
    """The Python that runs the ranks on the compute nodes ('' = the one running `python -m hpc_train` now)."""
    container: str = ""
    """A wrapper command put before that Python, split like a shell would: 'apptainer exec --nv img.sif' or
    'singularity exec --nv img.sif'. It wraps the batch step (the supervisor, which runs srun: the image needs
    Slurm's commands, e.g. bound in) and every training step. For pyxis/enroot, give srun's own flags instead:
    cluster.srun_args=[--container-image=nvcr.io#nvidia/pytorch:24.05-py3]."""
    srun_args: list[str] = field(default_factory=list)
    """Extra srun arguments; --kill-on-bad-exit=1 and --wait are always there."""
    srun_wait_s: int = 60
    """srun --wait: after the first task ends, the others get this long before srun kills them."""
    signal: str = "USR2"
    """Signal Slurm sends to the ranks before the time limit (USR2: NCCL can swallow USR1); one of STOP_SIGNALS,
    which every rank catches as its notice to checkpoint and stop."""
    signal_lead_s: int = 90
    """How long before the time limit the signal comes."""
    array_parallelism: int = 0
    """For sweeps: how many array elements may run at once (0: no limit)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the cluster offers, recorded by `python -m hpc_train.profile --write` (partitions with their node
    CPUs, memory, GPUs and MaxTime; accounts; QoS). Requests are checked against live Slurm where it answers,
    against these facts where it does not (a dry run on a laptop). Empty: nothing recorded."""
    max_restarts: int = 10
    """After the preemption signal the job checkpoints and requeues itself, at most this many times."""
    max_stalled_restarts: int = 2
    """Requeues in a row that may end without a new step; one more and requeueing stops with an error."""
    spare_nodes: int = 0
    """Spare nodes: the job asks Slurm for nodes + spare_nodes and trains on `nodes` of them. A node blamed for a
    failure (a rank on it killed, the node lost, a frozen rank) is left out of the next attempt. With spares the
    job is submitted with --no-kill, so that a lost node does not end the allocation."""
    max_failures: int = 5
    """In-allocation restarts: after a failure worth retrying (a rank killed, a node lost, a collective error,
    a hang), the job starts training again in the same allocation, from the newest checkpoint, at most this
    many times per allocation (0: a failure ends the job; a requeued job counts afresh)."""
    max_stalled_failures: int = 1
    """Failed attempts in a row that may end without a new checkpoint; one more and the job gives up."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        self._one_of("launcher", LAUNCHERS)
        # Before tasks_per_node is derived from it: a bad value is reported under the key the user typed.
        self._bounded("gpus_per_node", 0, 128, "0 for CPU", why="torch's device index is 8 bits")
        if self.tasks_per_node == 0:
            self.tasks_per_node = self.gpus_per_node or 1
        self._bounded("nodes", 1, INT32_MAX, 1, why="2**31-1: torch numbers ranks with a C int")
        for key in ("tasks_per_node", "cpus_per_task"):
            self._bounded(key, 1, SLURM_U16_MAX, 1, why="Slurm keeps it in 16 bits")
        self._require(
            self.world_size <= INT32_MAX,
            "nodes",
            f"{self.nodes} nodes x {self.tasks_per_node} tasks per node is more ranks than torch can number "
            f"(at most 2**31-1)",
            "use fewer nodes or tasks per node",
        )
        self._bounded("timeout_min", 0.0, YEAR_MIN, 60, above=True, why="365 days")
        self._bounded("failure_grace_s", 0.0, YEAR_S, 15, why="365 days")
        self._check_signal()
        if self.gpus_per_node:  # on every launcher: the local one gives its ranks gpus_per_node GPUs too
            self._require(
                self.tasks_per_node <= self.gpus_per_node,
                "tasks_per_node",
                f"{self.tasks_per_node} tasks per node would share {self.gpus_per_node} GPUs (NCCL needs one GPU per rank)",
                f"set cluster.tasks_per_node={self.gpus_per_node} (or 0 for one task per GPU)",
            )
        if self.launcher in ("local", "debug"):
            self._require(
                self.nodes == 1,
                "nodes",
                f"the {self.launcher} launcher runs on this machine only",
                "set cluster.nodes=1, or use cluster=slurm for several nodes",
            )
            self._warn_ignored()
        if self.launcher == "debug":
            self._require(
                self.tasks_per_node == 1,
                "tasks_per_node",
                "the debug launcher runs one process, in the foreground, for pdb",
                "set cluster.tasks_per_node=1, or use cluster=local for several ranks",
            )
        if self.launcher == "slurm":
            self._check_slurm()

    def _check_slurm(self) -> None:
        self._one_of("submit", SUBMIT_MODES)
        self._one_of("gpu_binding", GPU_BINDINGS)
        for key in HOSTLIST_KEYS:
            self._check_hostlist(key)
        if self.gpu_binding == "task":
            self._require(
                self.gpus_per_node > 0 and self.tasks_per_node == self.gpus_per_node,
                "gpu_binding",
                "per-task binding gives each of tasks_per_node tasks one of gpus_per_node GPUs, so both must be equal and > 0",
                "set cluster.gpus_per_node=N and cluster.tasks_per_node=N, or cluster.gpu_binding=node",
            )
        self._require(
            not self.mem or _is_mem_size(self.mem),
            "mem",
            "must be a size such as 500M, 64G or 0 (all of the node's memory)",
            "e.g. cluster.mem=64G",
        )
        self._bounded("signal_lead_s", 0, 0xFFFF, 90, why="sbatch --signal takes at most 65535 seconds")
        self._require(
            self.signal_lead_s < self.timeout_min * 60,
            "signal_lead_s",
            f"must be shorter than the time limit (cluster.timeout_min={self.timeout_min:g})",
            "e.g. cluster.signal_lead_s=90",
        )
        self._bounded("srun_wait_s", 0, YEAR_S, 60, why="365 days")
        for key in ("array_parallelism", "spare_nodes"):
            self._bounded(key, 0, INT32_MAX, 0, why="2**31-1: Slurm keeps it in 32 bits")
        self._require(
            self.allocated_nodes <= INT32_MAX,
            "spare_nodes",
            f"cluster.nodes={self.nodes} plus {self.spare_nodes} spare nodes is more than Slurm can count (2**31-1)",
            "use fewer spare nodes, e.g. cluster.spare_nodes=1",
        )
        for key in ("max_restarts", "max_stalled_restarts", "max_failures", "max_stalled_failures"):
            self._bounded(key, 0, INT64_MAX, 0, why="2**63-1")
        for flag in self.sbatch_args:
            managed = MANAGED_SBATCH_FLAGS.get(flag)
            self._require(managed is None, "sbatch_args", f"--{flag} is set by hpc_train", f"use {managed} instead")
            self._require(
                re.fullmatch(r"[a-z][a-z0-9-]*", flag) is not None,
                "sbatch_args",
                f"{flag!r} is not an sbatch flag name",
                "give flag names without dashes, e.g. cluster.sbatch_args={mail-type: END}",
            )
        self._require(
            len(_shell_words(self.python)) <= 1 or Path(self.python).is_file(),  # a path with a space is fine
            "python",
            "must be one executable; a wrapper such as `apptainer exec` would be quoted as part of its name",
            f"set cluster.python to the Python inside, and the wrapper as cluster.container="
            f"'{shlex.join(_shell_words(self.python)[:-1])}'",
        )
        self._require(
            bool(self.container.strip()) == bool(_shell_words(self.container)),
            "container",
            "cannot be split into words (unbalanced quotes?)",
            "e.g. cluster.container='apptainer exec --nv img.sif'",
        )
        for line in self.setup:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                words, problem = [], str(exc)
            else:
                problem = "it is empty"
            self._require(bool(words), "setup", f"cannot split {line!r} into words: {problem}", "balance the quotes")

    def _check_signal(self) -> None:
        """cluster.signal is one every rank catches as its notice to checkpoint and stop (on every launcher: the
        ranks install a handler for it, and a signal that cannot have one would fail each of them)."""
        name = self.signal.upper().removeprefix("SIG")
        if name in STOP_SIGNALS:
            return
        close = difflib.get_close_matches(name, STOP_SIGNALS, n=1)
        if name in _UNCATCHABLE:
            rule = f"SIG{name} cannot be caught, so no rank could checkpoint before it ends them"
        else:
            rule = f"must be a signal the ranks can catch as a stop notice: one of {', '.join(STOP_SIGNALS)}"
        hint = f"did you mean {close[0]}? " if close and name not in _UNCATCHABLE else ""
        self._require(False, "signal", rule, f"{hint}use cluster.signal=USR2 (or USR1, TERM)")

    def _check_hostlist(self, key: str) -> None:
        from hpc_train.core.hostlist import expand_hostlist

        value = getattr(self, key)
        if not value:
            return
        try:
            expand_hostlist(value)
        except ValueError as exc:
            reason = str(exc).split(": ", 1)[-1]
            self._require(False, key, f"not a Slurm hostlist ({reason})", f"e.g. cluster.{key}='\"node[07-08]\"'")

    def _warn_ignored(self) -> None:
        defaults = ClusterConfig.__dataclass_fields__
        for key in _SLURM_ONLY:
            default = defaults[key]
            value = default.default if default.default_factory is MISSING_FACTORY else default.default_factory()
            if getattr(self, key) != value:
                warnings.warn(f"cluster.{key} is ignored by cluster.launcher={self.launcher}", stacklevel=2)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def container_argv(self) -> list[str]:
        """cluster.container as the words that go before the Python of the batch step and of every rank."""
        return _shell_words(self.container)

    @property
    def allocated_nodes(self) -> int:
        """The nodes asked of Slurm: those that train and the spares."""
        return self.nodes + self.spare_nodes


@dataclass
class DataConfig(_Checked):
    """A synthetic classification set: class-conditional Gaussians (a random mean per class, unit noise)."""

    _group: ClassVar[str] = "data"

    name: str = "synthetic"
    """Data set kind; only ``synthetic`` is built in."""
    num_samples: int = 32768
    """Samples in train + validation together."""
    input_shape: list[int] = field(default_factory=lambda: [784])
    """Shape of one input, e.g. [784] or [3, 32, 32]."""
    num_classes: int = 10
    """Number of classes."""
    seed: int = 0
    """Seed of the data itself (class means, samples, split), independent of the trainer's seed."""
    val_fraction: float = 0.1
    """Share of samples held out for validation."""
    class_separation: float = 3.0
    """Norm of each class mean against unit noise: larger is easier (about 0.9 accuracy at 3 with 10 classes)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0 loads in the training process)."""
    pin_memory: bool | None = None
    """Page-locked host batches for faster copies to the GPU (None: on when training on CUDA)."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead (only with num_workers > 0)."""
    persistent_workers: bool = True
    """Keep workers alive between epochs (only with num_workers > 0)."""
    drop_last: bool = True
    """Drop each rank's last incomplete batch, so every optimizer step sees a full global batch."""
    dataset: Any = None
    """Your own data instead of the synthetic set: a Hydra node {_target_: pkg.make_data, ...} whose call returns
    (train_dataset, val_dataset) or {"train": ..., "val": ...}; val may be None. The fields above that describe
    the synthetic set are then ignored."""

    def __post_init__(self) -> None:
        self._one_of("name", ("synthetic",))
        _check_target(self, "dataset")
        self._bounded("prefetch_factor", 1, INT32_MAX, 2, why="2**31-1")
        self._bounded("num_samples", 2, INT64_MAX, 32768, why="2**63-1")
        self._require(
            len(self.input_shape) >= 1 and all(1 <= int(d) <= INT64_MAX for d in self.input_shape),
            "input_shape",
            "must be a non-empty list of positive sizes (at most 2**63-1)",
            "e.g. data.input_shape=[784] or data.input_shape=[3,32,32]",
        )
        self._bounded("num_classes", 2, INT64_MAX, 10, why="2**63-1")
        self._bounded("seed", -INT64_MAX - 1, INT64_MAX, 0, why="int64: torch seeds a generator with it")
        self._require(0 <= self.val_fraction < 1, "val_fraction", "must be in [0, 1)", "e.g. data.val_fraction=0.1")
        self._bounded("class_separation", 0.0, FLOAT32_MAX, 3, above=True, why=_F32)
        self._bounded("num_workers", 0, INT32_MAX, 0, why="2**31-1")

    @property
    def num_val(self) -> int:
        return int(self.num_samples * self.val_fraction)

    @property
    def num_train(self) -> int:
        return self.num_samples - self.num_val


LR_SCALING = ("none", "linear", "sqrt")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "dp", "single")
SCHEDULES = ("constant", "cosine", "step")


def _check_target(node: _Checked, key: str) -> None:
    """A user-code field is None or a Hydra node naming what to call in ``_target_``."""
    value = getattr(node, key)
    node._require(
        value is None or (isinstance(value, Mapping) and isinstance(value.get("_target_"), str)),
        key,
        "must name a callable in _target_",
        f"e.g. {node._group}.{key}={{_target_: mypkg.mymodule.build}}",
    )


@dataclass
class ScheduleConfig(_Checked):
    """Learning-rate schedule over optimizer steps: linear warmup, then constant, cosine or step decay."""

    _group: ClassVar[str] = "trainer.schedule"

    name: str = "constant"
    """constant | cosine (to min_lr_ratio x LR at the last step) | step (x gamma every step_every steps)."""
    warmup_steps: int = 0
    """Steps of linear warmup from 0 to the (scaled) LR."""
    min_lr_ratio: float = 0.0
    """cosine: the LR at the last step, as a fraction of the peak."""
    step_every: int = 1000
    """step: decay every this many steps (after warmup)."""
    gamma: float = 0.1
    """step: the factor of each decay."""

    def __post_init__(self) -> None:
        self._one_of("name", SCHEDULES)
        self._bounded("warmup_steps", 0, INT64_MAX, 100, why="2**63-1")
        self._require(
            0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]", "e.g. trainer.schedule.min_lr_ratio=0.1"
        )
        self._bounded("step_every", 1, INT64_MAX, 1000, why="2**63-1")
        self._require(0 < self.gamma <= 1, "gamma", "must be in (0, 1]", "e.g. trainer.schedule.gamma=0.1")


@dataclass
class EarlyStoppingConfig(_Checked):
    """Stop when the monitored validation metric has not improved for ``patience`` validations."""

    _group: ClassVar[str] = "trainer.early_stopping"

    patience: int = 0
    """Validations without improvement before stopping (0: never stop early)."""
    monitor: str = "val_loss"
    """The validation metric to watch: val_loss, val_acc or val_metric (your trainer.metric)."""
    mode: str = "auto"
    """min or max; auto: min for val_loss, max for val_acc and val_metric (set min for an error-like metric)."""
    min_delta: float = 0.0
    """An improvement smaller than this does not count."""

    def __post_init__(self) -> None:
        self._bounded("patience", 0, INT64_MAX, 3, why="2**63-1; 0 is off")
        self._one_of("monitor", ("val_loss", "val_acc", "val_metric"))
        self._one_of("mode", ("auto", "min", "max"))
        self._bounded("min_delta", 0.0, FLOAT32_MAX, "1e-3", why=_F32)

    @property
    def direction(self) -> str:
        """min or max. ``auto`` is resolved here, when it is read, never in ``__post_init__``: the schema's
        default node is built before the command line's ``monitor`` is merged, so resolving it there would
        freeze the default monitor's direction (val_loss: min) for a val_acc that should rise."""
        if self.mode != "auto":
            return self.mode
        return "min" if self.monitor == "val_loss" else "max"


@dataclass
class DDPConfig(_Checked):
    """Options of torch's DistributedDataParallel (strategy=ddp)."""

    _group: ClassVar[str] = "trainer.ddp"

    find_unused_parameters: bool = False
    """Needed when some parameters get no gradient in a step (branches, frozen heads); costs a graph walk."""
    static_graph: bool = False
    """Promise the graph is the same every step: lets DDP skip work (and makes unused parameters fine)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the all-reduce buckets: no copy into and out of the buckets each step, and one
    gradient-sized buffer less. On (unlike torch's default): +5-8% samples/s for a 2-rank CPU MLP. Set false if
    your code calls ``.detach_()`` on a gradient, which a view does not allow."""
    bucket_cap_mb: float = 25.0
    """Size of the gradient buckets all-reduced together."""

    def __post_init__(self) -> None:
        # DDP turns it into a whole number of bytes (a C++ size): a bucket beyond 1 TiB is one bucket anyway.
        self._bounded("bucket_cap_mb", 0.0, 1024.0 * 1024, 25, above=True, why="1 TiB")


@dataclass
class TrainerConfig(_Checked):
    """The training loop. Step counts are optimizer steps."""

    _group: ClassVar[str] = "trainer"

    max_epochs: int | None = None
    """Stop after this many epochs (0: no epoch limit). Unset: 3 epochs, or no epoch limit when max_steps is set
    (Lightning's convention), so trainer.max_steps=1500 runs 1500 steps."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: no step limit). With both set, whichever comes first ends
    training; the start-up line says which one binds."""
    batch_size: int = 64
    """Samples per process per step; the global batch is batch_size x world size."""
    lr: float = 1e-3
    """Base learning rate, meant for a global batch of ``lr_reference_batch_size``."""
    lr_scaling: str = "none"
    """How the base LR follows the global batch: linear (SGD-like), sqrt (Adam-like) or none."""
    lr_reference_batch_size: int = 128
    """The global batch size the base LR was tuned for (128: the default job's 64 per rank x 2 ranks)."""
    seed: int = 0
    """Seed of model initialisation and data order; the same seed and world size give the same result."""
    device: str = "auto"
    """auto: CUDA when a GPU is visible, else CPU."""
    log_every_n_steps: int = 20
    """Write a metrics.jsonl row (and reduce the loss across ranks) every N steps."""
    val_every_n_steps: int = 0
    """Validate every N steps (0: off)."""
    val_every_n_epochs: int = 1
    """Validate at the end of every N epochs (0: off). A final validation always runs."""
    checkpoint_every_n_steps: int = 0
    """Save a checkpoint every N steps (0: off)."""
    checkpoint_every_min: float = 10.0
    """Save a checkpoint once this many minutes have passed since the last one (0: off), so that a crash, a lost
    node or a hang costs at most this much training. When a save takes more than 1% of the interval, the
    interval grows to 100 saves' time, and rank 0's log says so."""
    keep_checkpoints: int = 2
    """How many checkpoints to keep (the newest verified one is never deleted)."""
    divergence_steps: int = 1
    """Training has diverged after this many optimizer steps in a row with a non-finite loss or gradient norm on
    any rank: the run ends as ``diverged`` (fatal: no retry, no requeue) and keeps its last finite checkpoint
    (0: never stop for it). Steps that fp16's grad scaler skips do not count."""
    dist_timeout_s: float = 300.0
    """Timeout of the rendezvous and of every collective: a lost rank fails the job after this."""
    preflight_timeout_s: float = 120.0
    """How long ranks wait for each other at start-up (and for a first tiny all-reduce) before failing with the
    list of ranks that arrived."""
    watchdog_s: float = 900.0
    """No step for this long: every rank dumps its thread stacks into its log and exits non-zero (0: off)."""
    progress_bar: bool = True
    """Show a progress bar on rank 0 where a terminal shows it; never in piped output or a batch job's log,
    where its carriage-return redraws would pile up."""
    precision: str = "fp32"
    """fp32, or autocast to bf16 / fp16 (fp16 adds a GradScaler)."""
    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this (0: off)."""
    accumulate_grad_batches: int = 1
    """Micro-batches per optimizer step; gradients are synchronised on the last one only."""
    strategy: str = "ddp"
    """ddp: one process per rank; dp: one process, torch.nn.DataParallel over its GPUs; single: one process, one device."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    loss: Any = None
    """Your loss instead of cross entropy: {_target_: ...} whose call returns loss(outputs, targets) -> scalar."""
    metric: Any = None
    """Your validation metric instead of accuracy: {_target_: ...} whose call returns fn(outputs, targets) -> one
    value per sample; reported as val_metric, the mean over exactly the validation set."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <run dir>/tensorboard (rank 0)."""
    plots: bool = True
    """Write PNG curves of metrics.jsonl to <run dir>/plots at the end (rank 0)."""
    profile_steps: int = 0
    """Record a torch.profiler trace of this many steps on rank 0 into <run dir>/profile (0: off)."""
    init_from: str = ""
    """Start a new run from the weights of an earlier one: a run dir (its model_final.pt, else its newest
    checkpoint), a model_*.pt state dict or a checkpoints/step_*.pt file. Weights only: the optimizer, the step
    and the data order start afresh. Ignored when this run dir has a checkpoint of its own to resume from."""
    compile: bool = False
    """torch.compile the model (after the DDP wrap, so DDP's optimizer splits the graph at bucket boundaries).
    The first steps take longer (compilation); later ones launch fewer, fused kernels."""

    DEFAULT_EPOCHS: ClassVar[int] = 3

    @property
    def epoch_limit(self) -> int:
        """The epoch limit in force (0: none): max_epochs when set, else 3 unless max_steps is set."""
        if self.max_epochs is not None:
            return self.max_epochs
        return 0 if self.max_steps else self.DEFAULT_EPOCHS

    def __post_init__(self) -> None:
        if self.max_epochs is not None:
            self._bounded("max_epochs", 0, INT64_MAX, 3, why="2**63-1; 0 is no limit")
        self._bounded("max_steps", 0, INT64_MAX, 1000, why="2**63-1; 0 is no limit")
        self._require(
            self.epoch_limit > 0 or self.max_steps > 0,
            "max_steps",
            "max_steps and max_epochs are both 0, so training would never end",
            "set trainer.max_epochs=3 or trainer.max_steps=1000",
        )
        self._bounded("batch_size", 1, INT64_MAX, 64, why="2**63-1")
        self._bounded("lr", 0.0, FLOAT32_MAX, "1e-3", above=True, why=_F32)
        self._one_of("lr_scaling", LR_SCALING)
        self._bounded("lr_reference_batch_size", 1, INT64_MAX, "128 (the global batch the base LR was tuned for)")
        # torch.manual_seed takes up to 2**64-1 and gets seed + rank; nothing seeds numpy or random with it.
        self._bounded("seed", -INT64_MAX - 1, INT64_MAX, 0, why="int64: torch seeds its generators with seed + rank")
        self._one_of("device", DEVICES)
        self._bounded("log_every_n_steps", 1, INT64_MAX, 20, why="2**63-1")
        for key in ("val_every_n_steps", "val_every_n_epochs", "checkpoint_every_n_steps"):
            self._bounded(key, 0, INT64_MAX, 0, why="2**63-1; 0 is off")
        self._bounded("divergence_steps", 0, INT64_MAX, 1, why="2**63-1; 0 is off")
        self._bounded("keep_checkpoints", 1, INT64_MAX, 2, why="2**63-1")
        self._bounded("checkpoint_every_min", 0.0, YEAR_MIN, 10, why="365 days; 0 is off")
        # Seconds go into timedelta, threading and faulthandler, which refuse inf and overflow far beyond a year.
        self._bounded("dist_timeout_s", 0.0, YEAR_S, 300, above=True, why="365 days")
        self._bounded("preflight_timeout_s", 0.0, YEAR_S, 120, above=True, why="365 days")
        self._bounded("watchdog_s", 0.0, YEAR_S, 900, why="365 days; 0 is off")
        self._one_of("precision", PRECISIONS)
        self._bounded("grad_clip_norm", 0.0, FLOAT32_MAX, "1.0 (0 is off)", why=_F32)
        self._bounded("accumulate_grad_batches", 1, INT64_MAX, 4, why="2**63-1")
        self._one_of("strategy", STRATEGIES)
        _check_target(self, "loss")
        _check_target(self, "metric")
        self._bounded("profile_steps", 0, INT64_MAX, 5, why="2**63-1; 0 is off")
        if self.early_stopping.monitor == "val_metric":
            self._require(
                self.metric is not None,
                "early_stopping",
                "monitor=val_metric needs trainer.metric",
                "set trainer.metric={_target_: ...} or monitor val_loss / val_acc",
            )


@dataclass
class MLPConfig(_Checked):
    """Fully connected classifier on flattened inputs."""

    _group: ClassVar[str] = "model"

    name: str = "mlp"
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Width of each hidden layer."""
    dropout: float = 0.0
    """Dropout after each hidden layer."""

    def __post_init__(self) -> None:
        self._require(
            all(1 <= h <= INT64_MAX for h in self.hidden_sizes),
            "hidden_sizes",
            "sizes must be positive (at most 2**63-1)",
            "e.g. model.hidden_sizes=[1024,1024]",
        )
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class CNNConfig(_Checked):
    """Small convolutional classifier for [C, H, W] inputs: conv-relu-pool blocks, then a linear head."""

    _group: ClassVar[str] = "model"

    name: str = "cnn"
    channels: list[int] = field(default_factory=lambda: [32, 64])
    """Output channels of each conv block (each block halves H and W)."""
    hidden_size: int = 128
    """Width of the hidden layer of the head."""
    dropout: float = 0.0
    """Dropout before the last layer."""

    def __post_init__(self) -> None:
        self._require(
            len(self.channels) >= 1 and all(1 <= c <= INT64_MAX for c in self.channels),
            "channels",
            "must be a non-empty list of positive sizes (at most 2**63-1)",
            "e.g. model.channels=[32,64]",
        )
        self._bounded("hidden_size", 1, INT64_MAX, 128, why="2**63-1")
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class TransformerConfig(_Checked):
    """A small transformer encoder classifier for [tokens, features] inputs: embed, encode, mean-pool, classify."""

    _group: ClassVar[str] = "model"

    name: str = "transformer"
    d_model: int = 64
    """Width of the token embeddings."""
    nhead: int = 4
    """Attention heads (must divide d_model)."""
    num_layers: int = 2
    """Encoder layers."""
    dim_feedforward: int = 128
    """Width of each layer's feed-forward block."""
    dropout: float = 0.0
    """Dropout inside the encoder layers."""

    def __post_init__(self) -> None:
        for key in ("d_model", "nhead", "num_layers", "dim_feedforward"):
            self._bounded(key, 1, INT64_MAX, 2, why="2**63-1")
        self._require(
            self.d_model % self.nhead == 0,
            "nhead",
            f"must divide model.d_model={self.d_model}",
            "e.g. model.d_model=64 model.nhead=4",
        )
        self._require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)", "e.g. model.dropout=0.1")


@dataclass
class ScriptConfig(_Checked):
    """Run your own torchrun-style script on every rank instead of the built-in trainer."""

    _group: ClassVar[str] = "script"

    path: str = ""
    """A Python file to run on every rank (made absolute when the config is built)."""
    module: str = ""
    """Or a module to run with python -m."""
    command: str = ""
    """Or an executable (a console entry point such as ``deepliif``, or a path), run as it is, like torchrun's
    --no-python; it must be found on PATH when the config is built."""
    args: Any = field(default_factory=list)
    """Its command-line arguments: a list (script.args=[--epochs,3]), or one string split like a shell would
    (script.args='--tag "a,b" --lr=1e-3'), or everything after a lone -- on the command line
    (hpc-train script.path=train.py -- --tag "a,b" --lr=1e-3)."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        given = [key for key in ("path", "module", "command") if getattr(self, key)]
        self._require(
            len(given) <= 1,
            given[-1] if given else "path",
            f"give one of script.path, script.module and script.command, not {' and '.join(given)}",
            "drop all but one",
        )
        self._require(
            (isinstance(self.args, Sequence) and not isinstance(self.args, str))
            or (isinstance(self.args, str) and (not self.args.strip() or bool(_shell_words(self.args)))),
            "args",
            "must be a list of words, or one string that splits like a shell command line (balanced quotes)",
            "script.args='--tag \"a,b\" --lr=1e-3', or put the arguments after -- at the end of the command line",
        )
        if self.command:
            found = shutil.which(os.path.expanduser(self.command))
            self._require(
                found is not None,
                "command",
                "not an executable on PATH (nor an executable file)",
                "install it into this environment, or give its full path, e.g. script.command=$HOME/bin/train",
            )
        if self.path:
            path = Path(self.path).expanduser()
            self._require(
                path.is_file(), "path", "no such file", "give the path of your script, e.g. script.path=train.py"
            )
            self.path = str(path.resolve())

    @property
    def enabled(self) -> bool:
        return bool(self.path or self.module or self.command)

    @property
    def argv(self) -> list[str]:
        """The script's arguments as words: a string is split like a shell would ([] if it cannot be)."""
        if isinstance(self.args, str):
            return _shell_words(self.args)
        return [str(a) for a in self.args]


@dataclass
class AdamWConfig(_Checked):
    """torch.optim.AdamW; the learning rate comes from trainer.lr."""

    _group: ClassVar[str] = "optim"

    name: str = "adamw"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    fused: bool | None = None
    """One fused kernel for the whole update instead of a few per parameter group. None: fused when the
    parameters are on a GPU (fewer kernel launches per step), the multi-tensor (foreach) kernels on CPU."""

    def __post_init__(self) -> None:
        self._require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            "must be two numbers in [0, 1)",
            "e.g. optim.betas=[0.9,0.999]",
        )
        self._bounded("eps", 0.0, FLOAT32_MAX, "1e-8", why=_F32)
        self._bounded("weight_decay", 0.0, FLOAT32_MAX, 0.01, why=_F32)


@dataclass
class SGDConfig(_Checked):
    """torch.optim.SGD; the learning rate comes from trainer.lr."""

    _group: ClassVar[str] = "optim"

    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self._require(0 <= self.momentum < 1, "momentum", "must be in [0, 1)", "e.g. optim.momentum=0.9")
        self._require(
            not self.nesterov or self.momentum > 0,
            "nesterov",
            "Nesterov momentum needs optim.momentum > 0",
            "set optim.momentum=0.9 or optim.nesterov=false",
        )
        self._bounded("weight_decay", 0.0, FLOAT32_MAX, 0, why=_F32)


RESUME_SAFE_KEYS = (
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.log_every_n_steps",
    "trainer.val_every_n_steps",
    "trainer.val_every_n_epochs",
    "trainer.checkpoint_every_n_steps",
    "trainer.checkpoint_every_min",
    "trainer.keep_checkpoints",
    "trainer.divergence_steps",
    "trainer.dist_timeout_s",
    "trainer.preflight_timeout_s",
    "trainer.watchdog_s",
    "trainer.progress_bar",
    "trainer.tensorboard",
    "trainer.plots",
    "trainer.profile_steps",
    "trainer.early_stopping.patience",
    "trainer.init_from",  # read only when the run dir has no checkpoint of its own
    "cluster.timeout_min",
    "cluster.failure_grace_s",
    "cluster.submit",
    "cluster.dry_run",
    "cluster.wait",
    "cluster.partition",
    "cluster.account",
    "cluster.qos",
    "cluster.constraint",
    "cluster.exclude",
    "cluster.mem",
    "cluster.job_name",
    "cluster.sbatch_args",
    "cluster.setup",
    "cluster.python",
    "cluster.container",
    "cluster.srun_args",
    "cluster.srun_wait_s",
    "cluster.signal",
    "cluster.signal_lead_s",
    "cluster.array_parallelism",
    "cluster.facts",
    "cluster.max_restarts",
    "cluster.max_stalled_restarts",
    "cluster.spare_nodes",
    "cluster.max_failures",
    "cluster.max_stalled_failures",
)
"""Keys a resubmission of a run dir may change: they do not change what has been trained so far (how long to
go on, how often to log and save, where and how the job is queued). Every other key is fixed by the run's
first config.yaml: the model, data, optimizer, seed, batch and the shape of the job."""

MODEL_SCHEMAS: dict[str, type[Any]] = {"mlp": MLPConfig, "cnn": CNNConfig, "transformer": TransformerConfig}
OPTIM_SCHEMAS: dict[str, type[Any]] = {"adamw": AdamWConfig, "sgd": SGDConfig}


@dataclass
class Config:
    """The whole job. ``model`` and ``optim`` hold one of the schemas in MODEL_SCHEMAS / OPTIM_SCHEMAS."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: Any = MISSING
    """One of MODEL_SCHEMAS, or your own model as {_target_: pkg.Net, ...} (a dict)."""
    optim: Any = MISSING
    script: ScriptConfig = field(default_factory=ScriptConfig)

    def __post_init__(self) -> None:
        shape = list(self.data.input_shape)
        if isinstance(self.model, CNNConfig) and len(shape) != 3:
            raise ConfigError(
                f"data.input_shape={shape} does not suit model=cnn, which needs [channels, height, width]. "
                "HINT: set data.input_shape=[3,32,32], or use model=mlp."
            )
        if isinstance(self.model, TransformerConfig) and len(shape) != 2:
            raise ConfigError(
                f"data.input_shape={shape} does not suit model=transformer, which needs [tokens, features]. "
                "HINT: set data.input_shape=[16,49] (784 values as 16 tokens), or use model=mlp."
            )
        if (
            self.trainer.device == "cuda"
            and self.cluster.gpus_per_node == 0
            and self.cluster.launcher != "debug"  # debug runs in this process and sees what this process sees
            and not self.script.enabled
        ):
            raise ConfigError(
                "trainer.device=cuda, but cluster.gpus_per_node=0 gives the ranks no GPU: the local launcher and "
                "Slurm hide every GPU a job did not ask for. HINT: set cluster.gpus_per_node=1 (a GPU per rank: "
                "the number of ranks on a node), or trainer.device=auto to train on the CPU."
            )
        world = self.cluster.world_size
        no_gpu = self.trainer.device == "cpu" or not self.cluster.gpus_per_node
        # (not on debug: it runs in this process, which may see this machine's GPUs)
        if self.trainer.strategy == "dp" and no_gpu and self.cluster.launcher != "debug":
            raise ConfigError(
                "trainer.strategy=dp splits each batch over the GPUs of one process, but this run has no GPU "
                f"(cluster.gpus_per_node={self.cluster.gpus_per_node}, trainer.device={self.trainer.device}): it "
                "would train in one process, silently. HINT: for CPU parallelism use trainer.strategy=ddp with "
                "cluster.tasks_per_node=N; or trainer.strategy=single for one process."
            )
        if self.trainer.strategy in ("dp", "single") and world != 1:
            raise ConfigError(
                f"trainer.strategy={self.trainer.strategy} runs one process, but the cluster asks for {world} ranks. "
                "HINT: set cluster.tasks_per_node=1 (and cluster.nodes=1), or trainer.strategy=ddp."
            )
        if self.data.dataset is None:
            self._check_synthetic_sizes(world)

    def _check_synthetic_sizes(self, world: int) -> None:
        per_rank = self.data.num_train // world
        micro = self.trainer.batch_size * self.trainer.accumulate_grad_batches
        if per_rank < micro and self.data.drop_last:
            raise ConfigError(
                f"trainer.batch_size={self.trainer.batch_size} x trainer.accumulate_grad_batches="
                f"{self.trainer.accumulate_grad_batches} is more than the {per_rank} training samples each of "
                f"{world} ranks gets (data.num_samples={self.data.num_samples}, data.val_fraction="
                f"{self.data.val_fraction}), so with data.drop_last=true no step would run. HINT: lower "
                "trainer.batch_size or raise data.num_samples."
            )
        if self.data.num_val and self.data.num_val < world:
            raise ConfigError(
                f"data.val_fraction={self.data.val_fraction} leaves {self.data.num_val} validation samples for "
                f"{world} ranks; every rank needs at least one. HINT: raise data.val_fraction or data.num_samples, "
                "or set data.val_fraction=0 to skip validation."
            )

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: per process x world size x accumulation."""
        return self.trainer.batch_size * self.cluster.world_size * self.trainer.accumulate_grad_batches


def _typed_option(node: Any, group: str, schemas: Mapping[str, type[Any]]) -> Any:
    """The structured schema for a model/optim node, chosen by its ``name``; a ``_target_`` model stays a dict."""
    # `"_target_" in node` is False while its value is still ??? (missing), so look at the keys.
    if group == "model" and isinstance(node, Mapping | DictConfig) and "_target_" in list(node.keys()):
        if (isinstance(node, DictConfig) and OmegaConf.is_missing(node, "_target_")) or not node.get("_target_"):
            raise ConfigError("model._target_ is not set. HINT: model=custom model._target_=mypkg.mymodule.MyNet")
        return node
    name = node.get("name") if isinstance(node, Mapping | DictConfig) else None
    if not isinstance(name, str) or name not in schemas:
        raise ConfigError(
            f"{group}.name={name!r} is not a known {group}: choose one of {', '.join(sorted(schemas))}. "
            f"HINT: select one with {group}={sorted(schemas)[0]}."
        )
    return OmegaConf.merge(OmegaConf.structured(schemas[name]), node)


_READS_ENVIRONMENT = re.compile(r"\$\{\s*oc\.env\s*:")


def environment_keys(raw: Any, prefix: str = "") -> list[str]:
    """The keys of a composed, unresolved config whose values read environment variables (``${oc.env:...}``),
    Hydra's own node aside. Their resolved values land in config.yaml (and job.sbatch): a token a profile reads
    from the environment must not become readable by everyone who can read the run dir."""
    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=False)
    if isinstance(raw, str):
        return [prefix] if _READS_ENVIRONMENT.search(raw) else []
    items: Any = raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    found: list[str] = []
    for key, value in items:
        if not prefix and key == "hydra":
            continue
        found += environment_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def config_from_dict(data: Mapping[str, Any] | DictConfig) -> Config:
    """Validate a plain or OmegaConf mapping (e.g. a loaded ``config.yaml``) into a typed ``Config``.

    Unknown keys, wrong types and broken rules raise ``ConfigError``.
    """
    from omegaconf.errors import OmegaConfBaseException

    try:
        node = data if isinstance(data, DictConfig) else OmegaConf.create(dict(data))
        node = OmegaConf.masked_copy(node, [str(k) for k in node if k != "hydra"])
        typed = OmegaConf.merge(OmegaConf.structured(Config), node)
        typed.model = _typed_option(node.get("model"), "model", MODEL_SCHEMAS)
        typed.optim = _typed_option(node.get("optim"), "optim", OPTIM_SCHEMAS)
        if isinstance(typed, DictConfig):
            _refuse_added_keys(typed)
        config = OmegaConf.to_object(typed)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    assert isinstance(config, Config)
    return config


def _omegaconf_message(exc: Exception) -> str:
    """OmegaConf's message with its key, plus the valid keys when a key is unknown."""
    key = getattr(exc, "full_key", "") or ""
    text = str(exc).splitlines()[0]
    parent = getattr(exc, "object_type", None)
    if "not in" in text and parent is not None and hasattr(parent, "__dataclass_fields__"):
        return _unknown_key_message(key, parent)
    return f"{key}: {text}" if key else text


def _unknown_key_message(key: str, schema: type[Any]) -> str:
    valid = sorted(f.name for f in fields(schema))
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown config key {key!r}. HINT: {hint}valid keys here: {', '.join(valid)}."


def _refuse_added_keys(node: DictConfig, prefix: str = "") -> None:
    """No typed node holds a key its schema lacks. Hydra's ``+trainer.typo=1`` adds one to a structured node,
    and merging and ``to_object`` would carry it along unread; a plain mapping's keys (your ``_target_``'s
    arguments, cluster.sbatch_args) are yours to choose."""
    schema: Any = OmegaConf.get_type(node)
    names = {f.name for f in fields(schema)} if is_dataclass(schema) else None
    for key in map(str, node):
        where = f"{prefix}{key}"
        if names is not None and key not in names:
            raise ConfigError(_unknown_key_message(where, schema))
        if not OmegaConf.is_interpolation(node, key) and isinstance(node[key], DictConfig):
            _refuse_added_keys(node[key], f"{where}.")


_TYPED_GROUPS: dict[str, type[Any]] = {
    "cluster": ClusterConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "script": ScriptConfig,
}


def _group_keys() -> dict[str, set[str]]:
    """Valid keys per top-level group; model/optim accept the fields of any of their options."""
    keys = {group: {f.name for f in fields(schema)} for group, schema in _TYPED_GROUPS.items()}
    keys["model"] = {f.name for schema in MODEL_SCHEMAS.values() for f in fields(schema)}
    keys["optim"] = {f.name for schema in OPTIM_SCHEMAS.values() for f in fields(schema)}
    return keys


_BRACKETED_VALUE = re.compile(r"([\w.]+)=([^\s'\"\[\],=]+\[[^'\"]*)")


def check_override_syntax(argv: list[str]) -> None:
    """Catch the override that Hydra's grammar cannot read because of an unquoted hostlist.

    ``cluster.exclude=node[07-08]`` fails deep in Hydra's parser ("mismatched input '['"): brackets after text
    are not valid there, since brackets start a list. The error here shows the quoted form that works.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("script.args="):
            try:
                parser.parse_overrides([arg])
            except HydraException:
                raise ConfigError(
                    f"{arg} cannot be read by Hydra's override grammar (an = or a comma inside an unquoted list "
                    'item breaks it). HINT: give the arguments as one string, script.args=\'--tag "a,b" '
                    "--lr=1e-3', or after a lone -- at the end: hpc-train script.path=train.py -- --tag a,b "
                    "--lr=1e-3"
                ) from None
        match = _BRACKETED_VALUE.fullmatch(arg)
        if match is None:
            continue
        try:
            parser.parse_overrides([arg])
        except HydraException:
            key, value = match.groups()
            raise ConfigError(
                f"{arg} cannot be read: in an override, brackets start a list, so a hostlist such as {value} must "
                f"be quoted for Hydra. HINT: write '{key}=\"{value}\"' (single quotes for the shell, double "
                "quotes for Hydra)."
            ) from None


def hydra_quoted(text: str) -> str:
    """``text`` as a single-quoted value of Hydra's override grammar (backslashes and quotes escaped): a path or
    a word that may hold commas, brackets, = or spaces."""
    # Hydra reads a backslash literally unless it comes before a quote or the closing quote: double only those.
    # (A ${...} stays an OmegaConf interpolation, as anywhere in a config: the shell has expanded $VARS already.)
    escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", text).replace("'", "\\'")
    return f"'{escaped}'"


def check_overrides(argv: list[str], config_dirs: list[Path] | None = None) -> None:
    """Every check of command-line overrides that runs before Hydra composes: the syntax Hydra's grammar would
    reject with an unhelpful message, then keys that neither the schema nor the chosen option files know.
    ``config_dirs``: the user's config folders when not given in ``argv`` (``--config-dir``). ConfigError on
    the first problem."""
    check_override_syntax(argv)
    from hpc_train.core.searchpath import config_dir_arg, user_config_dirs

    dirs = [*(config_dirs or []), *config_dir_arg(argv), *user_config_dirs()]
    keys = override_keys(argv)
    known = _group_keys()
    for key in keys:
        # A group of the user's own (conf/experiment/) is not in the defaults list: Hydra wants +group=option.
        if "." not in key and key not in known and any((d / key).is_dir() for d in dirs):
            value = next(a.split("=", 1)[1] for a in argv if a.startswith(f"{key}="))
            raise ConfigError(
                f"{key}={value}: {key} is a config group of yours, not one that hpc_train's defaults pick. "
                f"HINT: add it with a plus: +{key}={value}"
            )
    check_override_keys(keys, chosen_option_keys(argv, config_dirs or []), added=_added_keys(argv))


_OPTION_GROUPS = {"model": MODEL_SCHEMAS, "optim": OPTIM_SCHEMAS}


def chosen_option_keys(argv: list[str], config_dirs: list[Path]) -> dict[str, dict[str, set[str] | None]]:
    """Per group (model, optim), the options the command line picks (``model=tiny``, ``-m model=a,b``, or the
    default) and the keys each one's YAML file declares, theirs included: ``width`` for a user's
    ``conf/model/tiny.yaml`` holding ``width: 64``. None for an option whose file is not found (Hydra reports
    that itself)."""
    from importlib.resources import files

    from hpc_train.core.searchpath import option_file

    main = OmegaConf.to_container(OmegaConf.load(str(files("hpc_train.conf") / "config.yaml")))
    defaults: list[Any] = main.get("defaults", []) if isinstance(main, dict) else []
    dirs = [arg for d in config_dirs for arg in ("--config-dir", str(d))]
    chosen: dict[str, dict[str, set[str] | None]] = {}
    # A group of the user's own (+experiment=quick) may pick options itself (override /model: tiny): then the
    # option groups are not known before Hydra composes, and their keys are left for Hydra to judge.
    own_group = any(re.match(r"\+{1,2}[\w-]+=", a) and a.lstrip("+").split("=")[0] not in _OPTION_GROUPS for a in argv)
    for group, schemas in _OPTION_GROUPS.items():
        given = [a for a in argv if re.match(rf"\+{{0,2}}{group}=", a)]
        if own_group or (given and not re.fullmatch(rf"\+{{0,2}}{group}=[\w,.-]+", given[-1])):
            chosen[group] = {"(chosen when composed)": None}  # or a sweep function: choice(...), glob(...)
            continue
        picked = [a.split("=", 1)[1] for a in given]
        names = (
            picked[-1].split(",") if picked else [d[group] for d in defaults if isinstance(d, Mapping) and group in d]
        )
        chosen[group] = {}
        for name in names:
            path = option_file(group, name, [*argv, *dirs])
            chosen[group][name] = None if path is None else _option_keys(path, group, schemas)
    return chosen


def _option_keys(path: Path, group: str, schemas: Mapping[str, type[Any]]) -> set[str] | None:
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        return set()
    defaults = node.get("defaults", []) or []
    if "@package _global_" in path.read_text().split("\n", 1)[0]:  # it sets keys of other groups too
        node = node.get(group) or OmegaConf.create()
    keys = {str(k) for k in node if k != "defaults"}
    named = [node.get("name"), *(str(d).split("@")[0].removeprefix("schema_") for d in defaults)]
    for name in named:
        if name in schemas:
            keys |= {f.name for f in fields(schemas[name])}
    return keys


def override_keys(argv: list[str]) -> list[str]:
    """The keys of the plain ``key=value`` overrides in ``argv`` (not ``+add``, ``~delete`` or Hydra's flags)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    candidates = [a for a in argv if "=" in a and not a.startswith(("-", "+", "~"))]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException:
        return []  # Hydra reports the syntax error itself, with its own message
    return [o.key_or_group for o in overrides]


def _added_keys(argv: list[str]) -> list[str]:
    """The dotted keys that ``+key=value`` / ``++key=value`` overrides add under hpc_train's own groups
    (``+trainer.typo=1``); a ``+group=option`` (``+experiment=quick``) picks a config group and is Hydra's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    candidates = [a for a in argv if "=" in a and a.startswith("+")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException:
        return []  # Hydra reports the syntax error itself
    keys = [o.key_or_group for o in overrides]
    return [k for k in keys if "." in k and k.split(".", 1)[0] in _TYPED_GROUPS.keys() | _OPTION_GROUPS.keys()]


def _nested_unknown(group: str, path: list[str]) -> tuple[str, type[Any]] | None:
    """For ``trainer.ddp.typo`` (group trainer, path [ddp, typo]): (``trainer.ddp``, DDPConfig), the typed node
    that lacks the key; None when every part is known or leads into a node whose keys are the user's."""
    schema: Any = _TYPED_GROUPS.get(group)
    where = group
    for name in path:
        if schema is None:
            return None
        if name not in {f.name for f in fields(schema)}:
            return where, schema
        kind = get_type_hints(schema).get(name)
        schema = kind if isinstance(kind, type) and is_dataclass(kind) else None
        where = f"{where}.{name}"
    return None


def check_override_keys(
    keys: list[str], chosen: Mapping[str, Mapping[str, set[str] | None]] | None = None, added: Sequence[str] = ()
) -> None:
    """Reject command-line keys the schema does not know, naming the closest valid key and listing all.
    ``chosen`` (from ``chosen_option_keys``): the model/optim options picked and their keys; their keys are
    valid too, and an unknown key lists them. ``added``: the keys of ``+key=value`` overrides, refused alike
    (Hydra would add them to the schema's node, where nothing reads them), except a new argument of a
    ``_target_`` (``+model.bias=false``).

    Hydra's own message for a typo suggests adding it with ``+key=value``, which only moves the error.
    """
    groups = _group_keys()
    # your own model takes whatever arguments it declares
    custom_model = "model._target_" in keys or "model._target_" in added
    open_groups = {g for g, options in (chosen or {}).items() if any(k is None for k in options.values())}
    for group, options in (chosen or {}).items():
        if group not in open_groups and options:
            groups[group] = set().union(*(k for k in options.values() if k is not None))
    for key in [*keys, *added]:
        group, _, rest = key.partition(".")
        if group == "hydra" or (group == "model" and custom_model) or group in open_groups:
            continue
        if key in added and "_target_" in groups.get(group, ()):
            continue  # a new argument of your _target_ is added with a plus
        if group not in groups:
            close = difflib.get_close_matches(group, sorted(groups), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown config key {key!r}. HINT: {hint}top-level groups: {', '.join(sorted(groups))}.")
        field_name = rest.split(".", 1)[0]
        if rest and field_name not in groups[group]:
            valid = sorted(groups[group])
            close = difflib.get_close_matches(field_name, valid, n=1)
            hint = f"did you mean {group}.{close[0]}? " if close else ""
            picked = "/".join((chosen or {}).get(group, {}))
            where = f"{group} (option {picked})" if picked else group
            more = ""
            if "_target_" in groups[group]:
                more = f" A new argument of your _target_ is added with a plus: +{key}=VALUE."
            raise ConfigError(
                f"unknown config key {key!r}. HINT: {hint}valid keys in {where}: {', '.join(valid)}.{more}"
            )
        nested = _nested_unknown(group, rest.split(".")) if rest else None
        if nested is not None:
            node, schema = nested
            valid = sorted(f.name for f in fields(schema))
            close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
            hint = f"did you mean {node}.{close[0]}? " if close else ""
            raise ConfigError(f"unknown config key {key!r}. HINT: {hint}valid keys in {node}: {', '.join(valid)}.")


def load_config(path: str | Path) -> Config:
    """Read and validate a saved ``config.yaml`` (what a worker does in its run directory)."""
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of config groups, found a list")
    return config_from_dict(node)


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore: ``config_schema`` and one schema per model/optim option."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    schema = OmegaConf.structured(Config)
    # Building the node runs ClusterConfig.__post_init__, which turns tasks_per_node=0 ("one task per GPU") into
    # 1 for an empty cluster. Stored so, every composed config would start from 1, and a profile's
    # gpus_per_node could no longer choose the task count. The node keeps the declared default instead.
    schema.cluster.tasks_per_node = 0
    # Mappings whose keys are the user's to choose: Hydra's struct mode would ask for a + before each new key
    # (cluster.sbatch_args={mail-type: END}). An explicit False here outlives the struct flag Hydra sets above.
    for open_node in (schema.cluster.sbatch_args, schema.cluster.facts):
        OmegaConf.set_struct(open_node, False)
    cs.store(name="config_schema", node=schema)
    # Multirun sweeps go through hpc_train's launcher: one Slurm array, or local runs one after another.
    launcher = {"_target_": "hydra_plugins.hpc_train_launcher.launcher.HpcTrainLauncher"}
    cs.store(group="hydra/launcher", name="hpc_train", node=launcher, provider="hpc_train")
    for name, schema in MODEL_SCHEMAS.items():
        cs.store(group="model", name=f"schema_{name}", node=schema)
    for name, schema in OPTIM_SCHEMAS.items():
        cs.store(group="optim", name=f"schema_{name}", node=schema)
