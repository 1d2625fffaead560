"""The ``cluster`` group: where and how wide the job runs, and (for Slurm) what to ask the scheduler for."""

from __future__ import annotations

import difflib
import functools
import re
import shlex
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from hpc_train.config.checks import INT32_MAX, INT64_MAX, SLURM_U16_MAX, YEAR_MIN, YEAR_S, Checked, invalid, shell_words
from hpc_train.config.sizes import is_mem_size
from hpc_train.core.errors import ConfigError
from hpc_train.core.hostlist import expand_hostlist

__all__ = [
    "GPU_BINDINGS",
    "HOSTLIST_KEYS",
    "LAUNCHERS",
    "MANAGED_SBATCH_FLAGS",
    "SHAPE_CHOICES",
    "SLURM_ONLY",
    "STOP_SIGNALS",
    "SUBMIT_MODES",
    "ClusterConfig",
    "SlurmConfig",
    "StragglerConfig",
    "check_python",
    "fold_slurm_aliases",
    "merge_slurm_value",
]

STOP_SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP")
"""What ``cluster.signal`` may be: signals that sbatch's --signal knows by name and a rank can catch as a notice to
checkpoint and stop. Slurm's other names are refused: KILL and STOP cannot be caught; TSTP, TTIN, TTOU and CONT
stop or resume a process, URG comes with a socket's urgent data, ABRT reports a crash, and ALRM belongs to
timers in user code, so treating any of them as a stop request would be wrong."""
_UNCATCHABLE = ("KILL", "STOP")

LAUNCHERS = ("local", "debug", "slurm")

HOSTLIST_KEYS = ("exclude",)
"""ClusterConfig keys that hold a Slurm hostlist (checked with the same parser rank resolution uses)."""
SUBMIT_MODES = ("submitit", "sbatch", "here")
SHAPE_CHOICES = ("range", "earliest_finish")
"""cluster.slurm.shape: how a job that may train on a node range is submitted."""
GPU_BINDINGS = ("node", "task")
# sbatch flags hpc_train sets itself from the keys named here (or refuses: ntasks, gres, error, wrap);
# cluster.slurm.sbatch_args may not set them. tests/unit/test_sbatch.py checks that every flag the renderer writes
# is here.
MANAGED_SBATCH_FLAGS = {
    "nodes": "cluster.nodes",
    "ntasks": "cluster.nodes and cluster.tasks_per_node",
    "ntasks-per-node": "cluster.tasks_per_node",
    "cpus-per-task": "cluster.cpus_per_task",
    "gpus-per-node": "cluster.gpus_per_node",
    "gpus-per-task": "cluster.slurm.gpu_binding=task",
    "gres": "cluster.gpus_per_node",
    "mem": "cluster.slurm.mem",
    "time": "cluster.timeout_min",
    "partition": "cluster.slurm.partition",
    "account": "cluster.slurm.account",
    "qos": "cluster.slurm.qos",
    "constraint": "cluster.slurm.constraint",
    "exclude": "cluster.slurm.exclude",
    "job-name": "cluster.slurm.job_name",
    "signal": "cluster.signal and cluster.slurm.signal_lead_s",
    "requeue": "cluster.slurm.max_restarts (hpc_train requeues after the preemption signal)",
    "array": "a multirun (-m) sweep",
    "output": "the run directory",
    "error": "the run directory",
    "open-mode": "the run directory",
    "wrap": "the generated script",
}


@dataclass
class SlurmConfig(Checked):
    """``cluster.slurm``: what only a Slurm job uses. A local or debug run ignores these keys, with a warning
    for each one that is not at its default."""

    _group: ClassVar[str] = "cluster.slurm"
    _raw_shell: ClassVar[tuple[str, ...]] = ("setup",)

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
    cluster.slurm.srun_args=[--container-image=nvcr.io#nvidia/pytorch:24.05-py3]."""
    srun_args: list[str] = field(default_factory=list)
    """Extra srun arguments; --kill-on-bad-exit=1 and --wait are always there."""
    srun_wait_s: int = 60
    """srun --wait: after the first task ends, the others get this long before srun kills them."""
    signal_lead_s: str = "90"
    """How long before the time limit the signal comes: whole seconds, or ``auto``, which derives the lead from
    the run dir's measured step and checkpoint times (``hpc_train.runtime.timeouts``: AUTO_DEFAULT_LEAD_S on a
    first run) at submission and again at each attempt, whose supervisor then signals the step itself. A string
    so that it can hold ``auto``; a number is read as its digits."""
    array_parallelism: int = 0
    """For sweeps: how many array elements may run at once (0: no limit)."""
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
    shape: str = "range"
    """For a job that asks for a node range (``cluster.min_nodes``): range submits the range and starts on what is
    free; earliest_finish submits the one node count that would finish first, by Slurm's start estimates and the
    run's step times (``hpc_train.launch.shapes``). Both print the table of counts, starts and finishes."""
    grow_every_min: float = 10.0
    """A job that asked for a node range and runs on fewer than ``cluster.nodes`` checks this often whether more
    nodes would start at once; when they would and the work left is worth a checkpoint, a requeue and a
    start-up (estimated from the run's own figures, and printed), it checkpoints and requeues itself to come
    back larger (``runtime.grow``). 0 turns it off."""
    scaling: str = ""
    """A scaling study's table (the scaling.json of ``python -m hpc_train.scaling``) whose strong-scaling
    samples/s give the step time of node counts this run has not measured ('' = none)."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()  # on every launcher: a value may reach a script or a command anyway

    @property
    def lead_auto(self) -> bool:
        """``signal_lead_s=auto``: the lead is derived from the run's measurements."""
        return str(self.signal_lead_s).strip().lower() == "auto"

    @property
    def fixed_lead_s(self) -> int | None:
        """The lead the config sets, in seconds (None: ``auto``, or not a whole number, which ``check`` refuses)."""
        text = str(self.signal_lead_s).strip()
        return int(text) if text.isdigit() else None

    def _check_lead(self, cluster: ClusterConfig) -> None:
        """The signal lead is ``auto`` or whole seconds that sbatch takes, shorter than the time limit and no
        shorter than srun's grace: once the first rank has ended its stop, srun gives the others
        ``srun_wait_s`` before it kills them, so a stop may take that long, and all of it must come before the
        time limit (where Slurm ends every rank, checkpoint written or not)."""
        if self.lead_auto:
            return
        lead = self.fixed_lead_s
        self._require(
            lead is not None and lead <= 0xFFFF,
            "signal_lead_s",
            "must be auto or a whole number of seconds from 0 to 65535 (sbatch --signal takes at most 65535)",
            "e.g. cluster.slurm.signal_lead_s=90, or cluster.slurm.signal_lead_s=auto",
        )
        assert lead is not None
        self._require(
            lead < cluster.timeout_min * 60,
            "signal_lead_s",
            f"must be shorter than the time limit (cluster.timeout_min={cluster.timeout_min:g})",
            "e.g. cluster.slurm.signal_lead_s=90",
        )
        self._require(
            lead >= self.srun_wait_s,
            "signal_lead_s",
            f"is shorter than srun's grace (cluster.slurm.srun_wait_s={self.srun_wait_s}): after the first rank "
            "ends its stop, the others may take that long, and a stop must end before the time limit, where "
            "Slurm kills every rank",
            f"raise cluster.slurm.signal_lead_s to {self.srun_wait_s} or more (or auto), or lower "
            "cluster.slurm.srun_wait_s",
        )

    def check(self, cluster: ClusterConfig) -> None:
        """The rules of a Slurm job (``cluster.launcher=slurm``; other launchers ignore these keys), some of
        them against the rest of ``cluster``."""
        self._one_of("submit", SUBMIT_MODES)
        self._one_of("gpu_binding", GPU_BINDINGS)
        self._one_of("shape", SHAPE_CHOICES)
        self._bounded("grow_every_min", 0.0, YEAR_MIN, 10, why="365 days; 0 turns growing off")
        self._require(
            self.shape == "range" or cluster.asks_range,
            "shape",
            f"{self.shape} picks one node count of a range, but the job asks for a fixed {cluster.nodes} nodes "
            "(cluster.min_nodes is not below cluster.nodes)",
            f"set cluster.min_nodes below cluster.nodes={cluster.nodes}, or cluster.slurm.shape=range",
        )
        for key in HOSTLIST_KEYS:
            self._check_hostlist(key)
        if self.gpu_binding == "task":
            self._require(
                cluster.gpus_per_node > 0 and cluster.ranks_per_node == cluster.gpus_per_node,
                "gpu_binding",
                "per-task binding gives each of tasks_per_node tasks one of gpus_per_node GPUs, so both must be equal and > 0",
                "set cluster.gpus_per_node=N and cluster.tasks_per_node=N, or cluster.slurm.gpu_binding=node",
            )
            self._require(
                not cluster.asks_range,
                "gpu_binding",
                f"a job that asks for a node range (cluster.min_nodes={cluster.min_nodes} below cluster.nodes="
                f"{cluster.nodes}) asks Slurm for whole nodes' GPUs, not one a task",
                "use cluster.slurm.gpu_binding=node (each rank takes cuda:<local rank>), or drop cluster.min_nodes",
            )
        self._require(
            not self.mem or is_mem_size(self.mem),
            "mem",
            "must be a size such as 500M, 64G or 0 (all of the node's memory)",
            "e.g. cluster.slurm.mem=64G",
        )
        self._bounded("srun_wait_s", 0, YEAR_S, 60, why="365 days")
        self._check_lead(cluster)
        for key in ("array_parallelism", "spare_nodes"):
            self._bounded(key, 0, INT32_MAX, 0, why="2**31-1: Slurm keeps it in 32 bits")
        self._require(
            cluster.allocated_nodes <= INT32_MAX,
            "spare_nodes",
            f"cluster.nodes={cluster.nodes} plus {self.spare_nodes} spare nodes is more than Slurm can count (2**31-1)",
            "use fewer spare nodes, e.g. cluster.slurm.spare_nodes=1",
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
                "give flag names without dashes, e.g. cluster.slurm.sbatch_args={mail-type: END}",
            )
        check_python(self.python, is_file=lambda path: "/" in path)  # submission looks at the file itself
        self._require(
            bool(self.container.strip()) == bool(shell_words(self.container)),
            "container",
            "cannot be split into words (unbalanced quotes?)",
            "e.g. cluster.slurm.container='apptainer exec --nv img.sif'",
        )
        for line in self.setup:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                words, problem = [], str(exc)
            else:
                problem = "it is empty"
            self._require(bool(words), "setup", f"cannot split {line!r} into words: {problem}", "balance the quotes")

    def _check_hostlist(self, key: str) -> None:

        value = getattr(self, key)
        if not value:
            return
        try:
            expand_hostlist(value)
        except ValueError as exc:
            reason = str(exc).split(": ", 1)[-1]
            self._require(False, key, f"not a Slurm hostlist ({reason})", f"e.g. cluster.slurm.{key}='\"node[07-08]\"'")


SLURM_ONLY = tuple(f.name for f in fields(SlurmConfig))
"""The keys of ``cluster.slurm``: only a Slurm job uses them. Their old flat names (``cluster.<key>``) are
aliases, folded into ``cluster.slurm`` by ``fold_slurm_aliases``."""


@dataclass
class StragglerConfig(Checked):
    """``cluster.stragglers``: finding the rank that slows every other (``hpc_train.distributed.stragglers``).
    Each rank times its own forward and backward per step; every ``window_s`` the ranks send rank 0 their
    figure, and a rank at least ``margin`` times the median of the other ranks' for ``windows`` windows in a row is
    named."""

    _group: ClassVar[str] = "cluster.stragglers"

    enabled: bool = True
    """Time the ranks and name stragglers (the built-in trainer, the Hugging Face and Lightning callbacks, and
    scripts that call ``hpc_train.preemption.should_stop``)."""
    window_s: float = 60.0
    """How often the ranks share their figures (one small gather to rank 0 per window)."""
    margin: float = 1.25
    """How many times the median of the other ranks' own time per step a rank must take to count as slow in a
    window."""
    windows: int = 3
    """For how many windows in a row a rank must be slow before it is named (and named again, while it stays
    slow, at every window)."""
    replace_after_s: float = 0.0
    """A Slurm job with ``cluster.slurm.spare_nodes`` or ``cluster.min_nodes``: a node whose rank has been named
    for this long is treated as a bad node. The supervisor stops the step (the ranks checkpoint, the job is not
    requeued) and starts the next attempt in the same allocation without that node. 0: off (the default)."""

    def __post_init__(self) -> None:
        self._bounded("window_s", 1.0, 86400.0, 60, why="a day")
        self._bounded("margin", 1.0, 100.0, 1.25, above=True, why="1 would name half the ranks")
        self._bounded("windows", 1, 1000, 3)
        self._bounded("replace_after_s", 0.0, YEAR_S, 0, why="365 days; 0 is off")

    def check(self, cluster: ClusterConfig) -> None:
        """Replacing a slow node needs somewhere to go: a spare, or a node range to shrink within."""
        if not self.replace_after_s:
            return
        self._require(
            cluster.launcher == "slurm" and (cluster.slurm.spare_nodes > 0 or cluster.asks_range),
            "replace_after_s",
            f"replaces a slow node in a Slurm job's allocation, but this job has none to spare (cluster.launcher="
            f"{cluster.launcher}, cluster.slurm.spare_nodes={cluster.slurm.spare_nodes}, cluster.min_nodes="
            f"{cluster.min_nodes})",
            "add cluster.slurm.spare_nodes=1 (or cluster.min_nodes below cluster.nodes) on cluster=slurm, or set "
            "cluster.stragglers.replace_after_s=0",
        )


@dataclass
class ClusterConfig(Checked):
    """Where and how wide the job runs, and (for Slurm) what to ask the scheduler for."""

    _group: ClassVar[str] = "cluster"
    _raw_shell: ClassVar[tuple[str, ...]] = ("facts",)

    launcher: str = "local"
    """local: processes here via submitit's LocalExecutor; debug: this process (pdb works); slurm: a Slurm job."""
    nodes: int = 1
    """Number of nodes."""
    min_nodes: int | None = None
    """The fewest nodes a Slurm job may train on (None: ``nodes``, a fixed shape). Below ``nodes``, the job asks
    Slurm for the range (``--nodes=min_nodes-nodes``, spares on top), starts on what is free and comes back
    from a requeue on what is free then; and when a node is lost or blamed and no spare is left, the next
    attempt runs in the same allocation on the healthy nodes, down to this many. Every shape keeps the global
    batch, learning rate, schedule and sample order of ``nodes`` (``config.shape.on_nodes``), and the job is
    submitted with --no-kill. The built-in trainer only."""
    tasks_per_node: int = 0
    """Processes (ranks) per node; 0 picks gpus_per_node on GPU jobs and 1 on CPU jobs (``ranks_per_node``; a
    loaded config holds the number picked, see ``hpc_train.config.resolve``)."""
    gpus_per_node: int = 0
    """GPUs per node; 0 runs on CPU with gloo."""
    cpus_per_task: int = 1
    """CPU cores per rank; also the number of torch threads each rank uses. A local or debug run may ask for at
    most the cores this machine lets it use (checked before launch)."""
    timeout_min: float = 60.0
    """Wall-clock limit of the job (Slurm's --time, rounded up to whole minutes); the job is ended after it."""
    failure_grace_s: float = 15.0
    """After one rank fails, how long the others get to exit on their own before they are killed."""
    status_every_s: float = 10.0
    """How often each node's summary of its ranks (``status/node_<host>.json``: states, steps, progress) is
    rewritten in the run dir while it trains: one file update per node per period, whatever the ranks per node;
    a rank's start and end reach it at once. ``jobs status`` and the goodput ledger see steps this late at most."""
    signal: str = "USR2"
    """Signal Slurm sends to the ranks before the time limit (USR2: NCCL can swallow USR1); one of STOP_SIGNALS,
    which every rank catches as its notice to checkpoint and stop."""
    pack: int = 1
    """Sweep points per Slurm job (``-m`` with ``cluster=slurm``): K points share one allocation, each a job step
    of its own shape that runs beside the others, so a sweep is ceil(points / K) jobs. 1: one job per point.
    The job asks for K points' worth of tasks, GPUs and memory on each of ``nodes`` nodes (``hpc_train.runtime.pack``)."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the cluster offers, recorded by `python -m hpc_train.profile --write` (partitions with their node
    CPUs, memory, GPUs and MaxTime; accounts; QoS). Requests are checked against live Slurm where it answers,
    against these facts where it does not (a dry run on a laptop). Empty: nothing recorded."""
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    """Finding the rank that slows every other (``StragglerConfig``)."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """What only a Slurm job uses: the queue, the job script, requeue and restart limits (``SlurmConfig``). The
    old flat names (``cluster.partition``, ``cluster.max_restarts``, ...) still work, as aliases of these."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        self._one_of("launcher", LAUNCHERS)
        # Before tasks_per_node=0 is read from it: a bad value is reported under the key the user typed.
        self._bounded("gpus_per_node", 0, 128, "0 for CPU", why="torch's device index is 8 bits")
        self._bounded("nodes", 1, INT32_MAX, 1, why="2**31-1: torch numbers ranks with a C int")
        if self.min_nodes is not None:
            self._bounded("min_nodes", 1, self.nodes, self.nodes, why=f"at most cluster.nodes={self.nodes}")
        if self.tasks_per_node != 0:  # 0: one task per GPU (ranks_per_node)
            self._bounded("tasks_per_node", 1, SLURM_U16_MAX, 1, why="Slurm keeps it in 16 bits")
        self._bounded("cpus_per_task", 1, SLURM_U16_MAX, 1, why="Slurm keeps it in 16 bits")
        self._require(
            self.world_size <= INT32_MAX,
            "nodes",
            f"{self.nodes} nodes x {self.ranks_per_node} tasks per node is more ranks than torch can number "
            f"(at most 2**31-1)",
            "use fewer nodes or tasks per node",
        )
        self._bounded("timeout_min", 0.0, YEAR_MIN, 60, above=True, why="365 days")
        self._bounded("failure_grace_s", 0.0, YEAR_S, 15, why="365 days")
        self._bounded("status_every_s", 0.5, 3600.0, 10, why="an hour")
        self._check_signal()
        self._check_pack()
        if self.gpus_per_node:  # on every launcher: the local one gives its ranks gpus_per_node GPUs too
            self._require(
                self.ranks_per_node <= self.gpus_per_node,
                "tasks_per_node",
                f"{self.ranks_per_node} tasks per node would share {self.gpus_per_node} GPUs (NCCL needs one GPU per rank)",
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
                self.ranks_per_node == 1,
                "tasks_per_node",
                "the debug launcher runs one process, in the foreground, for pdb",
                "set cluster.tasks_per_node=1, or use cluster=local for several ranks",
            )
        if self.launcher == "slurm":
            self.slurm.check(self)
        self.stragglers.check(self)

    def _check_pack(self) -> None:
        """cluster.pack: its members share the allocation's nodes, each as one srun step of cluster.nodes nodes."""
        self._bounded("pack", 1, 1024, 1, why="a job of more steps than that is no longer small runs")
        if self.pack == 1:
            return
        self._require(
            self.launcher == "slurm",
            "pack",
            f"packing puts the points of a sweep into Slurm jobs, but cluster.launcher={self.launcher} runs them here, "
            "one after another",
            "set cluster.pack=1, or use cluster=slurm",
        )
        self._require(
            self.slurm.submit != "here",
            "pack",
            "cluster.slurm.submit=here trains in the allocation this shell holds, one run after another",
            "set cluster.pack=1, or submit the sweep as jobs (cluster.slurm.submit=submitit or sbatch)",
        )
        self._require(
            not self.slurm.spare_nodes and self.min_nodes is None,
            "pack",
            "the members of a pack share the allocation's nodes, so a lost node cannot be swapped for a spare "
            "(cluster.slurm.spare_nodes) or left out (cluster.min_nodes) for one member alone",
            "set cluster.pack=1 to keep spares or min_nodes, or drop them to pack",
        )

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

    def _warn_ignored(self) -> None:
        default = SlurmConfig()
        for key in SLURM_ONLY:
            if getattr(self.slurm, key) != getattr(default, key):
                warnings.warn(f"cluster.slurm.{key} is ignored by cluster.launcher={self.launcher}", stacklevel=3)

    @property
    def ranks_per_node(self) -> int:
        """The ranks each node runs: tasks_per_node, where 0 means one per GPU (one on a CPU job)."""
        return self.tasks_per_node or self.gpus_per_node or 1

    def resolved(self) -> ClusterConfig:
        """This cluster with tasks_per_node=0 replaced by the number it means: a copy (``self`` when there is
        nothing to fill in), as a loaded config holds it (``hpc_train.config.resolve``)."""
        if self.tasks_per_node == self.ranks_per_node:
            return self
        return replace(self, tasks_per_node=self.ranks_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def container_argv(self) -> list[str]:
        """cluster.slurm.container as the words that go before the Python of the batch step and of every rank."""
        return shell_words(self.slurm.container)

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes training may go on with after losing one: ``min_nodes``, or ``nodes``."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @property
    def allocated_nodes(self) -> int:
        """The most nodes asked of Slurm: those that train and the spares."""
        return self.nodes + self.slurm.spare_nodes

    @property
    def asks_range(self) -> bool:
        """The job asks Slurm for a node range (``cluster.min_nodes`` below ``cluster.nodes``)."""
        return self.fewest_nodes < self.nodes

    @property
    def nodes_request(self) -> str:
        """sbatch's --nodes: ``allocated_nodes``, or the range ``min_nodes-allocated_nodes``. A job given fewer than
        ``nodes`` trains on all it got; the nodes beyond ``nodes`` are its spares."""
        if self.asks_range:
            return f"{self.fewest_nodes}-{self.allocated_nodes}"
        return str(self.allocated_nodes)


# ---- the old flat names: cluster.<key> for cluster.slurm.<key> ----


def merge_slurm_value(key: str, flat: Any, nested: Any, *, nested_given: bool = False) -> Any:
    """The value of ``cluster.slurm.<key>`` when its old name ``cluster.<key>`` gives ``flat`` as well.

    The two agree when they are equal or the nested one is at its default; sbatch_args merge flag by flag.
    Otherwise the command line (``nested_given``: it set ``cluster.slurm.<key>``, as every command-line
    ``cluster.<key>`` is rewritten to) beats a file, and two values from files are a ConfigError naming both."""
    default = getattr(SlurmConfig(), key)
    if key == "sbatch_args" and isinstance(flat, Mapping) and isinstance(nested, Mapping):
        merged = dict(nested)
        for flag, value in flat.items():
            if flag not in merged or merged[flag] == value:
                merged[flag] = value
            elif not nested_given:
                raise _alias_conflict(f"sbatch_args.{flag}", value, merged[flag])
        return merged
    if nested in (default, flat):
        return flat
    if nested_given:
        return nested
    raise _alias_conflict(key, flat, nested)


def _alias_conflict(key: str, flat: Any, nested: Any) -> ConfigError:
    return ConfigError(
        f"cluster.{key}={flat!r} and cluster.slurm.{key}={nested!r} are both set, and cluster.{key} is the "
        f"old name of cluster.slurm.{key}. HINT: keep one: remove cluster.{key} from the profile, experiment file "
        f"or config.yaml that sets it, or set only cluster.slurm.{key}"
    )


def fold_slurm_aliases(cluster: Mapping[str, Any], given: Collection[str] = ()) -> dict[str, Any]:
    """A plain ``cluster`` mapping with its old flat keys (``partition``, ``max_restarts``, ...) moved into its
    ``slurm`` mapping (``merge_slurm_value``). ``given``: the dotted keys the command line set. The mapping
    given is not changed."""
    out = dict(cluster)
    flat = {key: out.pop(key) for key in SLURM_ONLY if key in out}
    if flat:
        slurm = dict(out.get("slurm") or {})
        for key, value in flat.items():
            nested = f"cluster.slurm.{key}"
            on_command_line = any(g in ("cluster.slurm", nested) or g.startswith(f"{nested}.") for g in given)
            slurm[key] = merge_slurm_value(
                key, value, slurm.get(key, getattr(SlurmConfig(), key)), nested_given=on_command_line
            )
        out["slurm"] = slurm
    return out


def _slurm_alias(key: str) -> property:
    def get(self: ClusterConfig) -> Any:
        return getattr(self.slurm, key)

    def put(self: ClusterConfig, value: Any) -> None:
        setattr(self.slurm, key, value)

    return property(get, put, doc=f"The old name of ``cluster.slurm.{key}``.")


def _with_slurm_aliases(init: Callable[..., None]) -> Callable[..., None]:
    """ClusterConfig's constructor, taking the old flat keyword arguments (``ClusterConfig(partition="gpu")``)
    into ``slurm``."""

    @functools.wraps(init)
    def wrapper(self: ClusterConfig, *args: Any, **kwargs: Any) -> None:
        flat = {key: kwargs.pop(key) for key in SLURM_ONLY if key in kwargs}
        if flat:
            slurm = kwargs.get("slurm") or SlurmConfig()
            merged = {key: merge_slurm_value(key, value, getattr(slurm, key)) for key, value in flat.items()}
            kwargs["slurm"] = replace(slurm, **merged)
        init(self, *args, **kwargs)

    return wrapper


# Code in hpc_train reads cluster.slurm.<key>; the aliases are for users' code and old configs.
ClusterConfig.__init__ = _with_slurm_aliases(ClusterConfig.__init__)  # type: ignore[method-assign]
for _key in SLURM_ONLY:
    setattr(ClusterConfig, _key, _slurm_alias(_key))


def check_python(python: str, is_file: Callable[[str], bool]) -> None:
    """cluster.slurm.python is one executable: one word, or the path of a file that holds a space
    (``/home/J Doe/venv/bin/python``), not a wrapper such as ``apptainer exec img.sif python``, which would be
    quoted as part of the executable's name. ``is_file`` tells such a path from a wrapper: at submission by
    looking at the file (``hpc_train.launch.preflight.check_paths``), in the config's own checks by its spelling
    alone (a path holds a slash), so that a saved config validates the same on every machine."""
    words = shell_words(python)
    if len(words) <= 1 or is_file(python):
        return
    raise invalid(
        "cluster.slurm.python",
        python,
        "must be one executable; a wrapper such as `apptainer exec` would be quoted as part of its name",
        f"set cluster.slurm.python to the Python inside, and the wrapper as cluster.slurm.container='{shlex.join(words[:-1])}'",
    )
