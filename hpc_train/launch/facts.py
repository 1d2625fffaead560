"""What a Slurm cluster offers (partitions, node sizes, GPUs, time limits, accounts, QoS), and requests checked
against it before anything is submitted.

Facts come live from ``scontrol show partition|node -o`` and ``sacctmgr`` where Slurm answers, or from the
``cluster.facts`` a profile recorded (``python -m hpc_train.profile --write``), so a dry run on a laptop is
checked too. A request that cannot run is refused with the key, the value, the partition's figure and the fix;
``sbatch --test-only`` stays the last word, and its refusals are translated to the key to change.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hpc_train.config import ClusterConfig, mem_mb
from hpc_train.core.errors import ConfigError

__all__ = [
    "ClusterFacts",
    "Partition",
    "check_pack",
    "check_request",
    "explain_slurm_refusal",
    "facts_for",
    "gres_gpus",
    "parse_cluster",
    "read_live",
    "slurm_minutes",
    "slurm_version",
]

QUERY_TIMEOUT_S = 15


@dataclass(frozen=True)
class Partition:
    """One partition, with the figures of its largest node (a request that fits no node cannot run)."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int
    gpu_types: tuple[str, ...]
    max_time_min: float | None
    """None: no limit."""
    default: bool
    state: str


@dataclass(frozen=True)
class ClusterFacts:
    partitions: dict[str, Partition]
    accounts: tuple[str, ...] | None
    """None where accounting cannot be asked (no slurmdbd): then accounts are not checked here."""
    qos: tuple[str, ...] | None
    source: str
    """Where the facts come from, for messages: Slurm itself, or the profile's record."""
    slurm_version: str | None = None
    """The Slurm the clients speak to (``sinfo --version``: ``24.11.5``); None where not known."""

    @property
    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions.values() if p.default), None)

    def to_record(self) -> dict[str, Any]:
        """The form a profile stores under ``cluster.facts`` (plain YAML types)."""
        return {
            "partitions": {
                n: {k: list(v) if k == "gpu_types" else v for k, v in asdict(p).items() if k != "name"}
                for n, p in self.partitions.items()
            },
            "accounts": list(self.accounts) if self.accounts is not None else None,
            "qos": list(self.qos) if self.qos is not None else None,
            "slurm_version": self.slurm_version,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], source: str) -> ClusterFacts:
        parts = {
            name: Partition(**{**values, "name": name, "gpu_types": tuple(values.get("gpu_types") or ())})
            for name, values in (record.get("partitions") or {}).items()
        }
        accounts, qos = record.get("accounts"), record.get("qos")
        return cls(
            parts,
            tuple(accounts) if accounts is not None else None,
            tuple(qos) if qos is not None else None,
            source,
            record.get("slurm_version"),
        )


# ---- parsing Slurm's words ------------------------------------------------------------------------------------


def _records(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o`` output: one record a line, ``Key=Value`` pairs split on white space."""
    out = []
    for line in text.splitlines():
        pairs = [item.split("=", 1) for item in line.split() if "=" in item]
        if pairs:
            out.append({k: v for k, v in pairs})
    return out


def slurm_minutes(value: str) -> float | None:
    """A Slurm time (``UNLIMITED``, ``60``, ``30:00``, ``2:00:00``, ``1-12:00:00``) in minutes; None: no limit."""
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:  # minutes alone ("60"), or hours when a day is given ("1-12")
        hours, minutes, seconds = (parts[0], 0, 0) if days else (0, parts[0], 0)
    elif len(parts) == 2:  # minutes:seconds, or hours:minutes after a day
        hours, minutes, seconds = (parts[0], parts[1], 0) if days else (0, parts[0], parts[1])
    else:
        hours, minutes, seconds = parts[-3:]
    return int(days or 0) * 1440 + hours * 60 + minutes + seconds / 60


def gres_gpus(gres: str) -> tuple[int, tuple[str, ...]]:
    """GPUs per node and their types from a node's Gres: ``gpu:a100:4(S:0-1),gpu:2`` -> (6, ('a100',))."""
    count, types = 0, []
    for item in re.split(r",(?![^(]*\))", gres or ""):
        fields = re.sub(r"\(.*\)$", "", item).split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        number = fields[-1]
        if not number.isdigit():  # "gpu:a100" with no count means one
            types.append(number)
            count += 1
            continue
        count += int(number)
        if len(fields) == 3:
            types.append(fields[1])
    return count, tuple(sorted(set(types)))


def parse_cluster(partitions_text: str, nodes_text: str) -> dict[str, Partition]:
    """Partitions from ``scontrol show partition -o`` and ``scontrol show node -o``."""
    nodes = _records(nodes_text)
    out = {}
    for part in _records(partitions_text):
        name = part.get("PartitionName", "")
        members = [n for n in nodes if name in n.get("Partitions", "").split(",")]
        gpus = [gres_gpus(n.get("Gres", "")) for n in members]
        out[name] = Partition(
            name=name,
            nodes=int(part.get("TotalNodes", len(members)) or len(members)),
            cpus=max((int(n.get("CPUTot", 0)) for n in members), default=0),
            mem_mb=max((int(n.get("RealMemory", 0)) for n in members), default=0),
            gpus=max((g for g, _ in gpus), default=0),
            gpu_types=tuple(sorted({t for _, ts in gpus for t in ts})),
            max_time_min=slurm_minutes(part.get("MaxTime", "UNLIMITED")),
            default=part.get("Default", "NO") == "YES",
            state=part.get("State", "UP"),
        )
    return out


# ---- reading the cluster --------------------------------------------------------------------------------------


def _ask(argv: list[str]) -> str | None:
    """The command's stdout, or None when it is missing, fails or does not answer in time."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(sorted({line.strip().split("|")[0] for line in text.splitlines() if line.strip()}))


def read_live(ask: Callable[[list[str]], str | None] = _ask) -> ClusterFacts | None:
    """The cluster as Slurm describes it now; None where Slurm does not answer (no scontrol, no controller)."""
    partitions, nodes = ask(["scontrol", "show", "partition", "-o"]), ask(["scontrol", "show", "node", "-o"])
    if partitions is None or nodes is None:
        return None
    accounts = _names(ask(["sacctmgr", "-nP", "show", "account", "format=account"]))
    qos = _names(ask(["sacctmgr", "-nP", "show", "qos", "format=name"]))
    return ClusterFacts(parse_cluster(partitions, nodes), accounts, qos, "asked Slurm just now", slurm_version(ask))


def slurm_version(ask: Callable[[list[str]], str | None] = _ask) -> str | None:
    """The Slurm the clients on PATH belong to, as ``sinfo --version`` says (``slurm-wlm 24.11.5`` ->
    ``24.11.5``); None where there is none."""
    found = re.search(r"\b(\d+\.\d+\.\d+)\b", ask(["sinfo", "--version"]) or "")
    return found.group(1) if found else None


def facts_for(cluster: ClusterConfig, live: bool) -> ClusterFacts | None:
    """Live facts when ``live`` and Slurm answers, else the profile's recorded ones, else None (no checks)."""
    facts = read_live() if live else None
    if facts is None and cluster.facts:
        recorded = cluster.facts.get("recorded", "an earlier day")
        facts = ClusterFacts.from_record(dict(cluster.facts), f"per the profile's cluster.facts, recorded {recorded}")
    return facts


# ---- checking a request ---------------------------------------------------------------------------------------


def _refuse(key: str, value: object, problem: str, hint: str) -> ConfigError:
    return ConfigError(f"cluster.{key}={value!r} cannot run: {problem}. HINT: {hint}")


def _check_name(key: str, value: str, known: Iterable[str] | None, what: str, source: str) -> None:
    if not value or known is None:
        return
    names = sorted(known)
    if value not in names:
        raise _refuse(key, value, f"there is no {what} {value!r} ({source})", f"pick one of: {', '.join(names)}")


def check_request(cluster: ClusterConfig, facts: ClusterFacts) -> None:
    """Refuse a request no node of its partition can run; ConfigError naming the key, the limit and the fix."""
    src = facts.source
    _check_name("slurm.partition", cluster.slurm.partition, facts.partitions, "partition", src)
    _check_name("slurm.account", cluster.slurm.account, facts.accounts, "account", src)
    _check_name("slurm.qos", cluster.slurm.qos, facts.qos, "QoS", src)
    part = facts.partitions.get(cluster.slurm.partition) if cluster.slurm.partition else facts.default_partition
    if part is None:
        return
    where = f"partition {part.name}" + (" (the default)" if not cluster.slurm.partition else "")
    if cluster.allocated_nodes > part.nodes:
        if cluster.slurm.spare_nodes:
            raise _refuse(
                "slurm.spare_nodes",
                cluster.slurm.spare_nodes,
                f"{cluster.nodes} nodes + {cluster.slurm.spare_nodes} spare = {cluster.allocated_nodes}, but {where} has "
                f"{part.nodes} nodes",
                f"set cluster.slurm.spare_nodes={max(part.nodes - cluster.nodes, 0)} or fewer, or pick a larger partition",
            )
        raise _refuse(
            "nodes", cluster.nodes, f"{where} has {part.nodes} nodes", f"set cluster.nodes={part.nodes} or fewer"
        )
    if cluster.gpus_per_node > part.gpus:
        fix = f"set cluster.gpus_per_node={part.gpus}" if part.gpus else "set cluster.gpus_per_node=0 (CPU)"
        others = sorted(p.name for p in facts.partitions.values() if p.gpus >= cluster.gpus_per_node)
        also = f", or cluster.slurm.partition={others[0]} ({', '.join(others)} have enough)" if others else ""
        raise _refuse("gpus_per_node", cluster.gpus_per_node, f"the nodes of {where} have {part.gpus} GPUs", fix + also)
    cpus = cluster.tasks_per_node * cluster.cpus_per_task
    if part.cpus and cpus > part.cpus:
        raise _refuse(
            "cpus_per_task",
            cluster.cpus_per_task,
            f"{cluster.tasks_per_node} tasks x {cluster.cpus_per_task} CPUs = {cpus}, but the nodes of {where} have "
            f"{part.cpus} CPUs",
            f"set cluster.cpus_per_task={max(1, part.cpus // cluster.tasks_per_node)} or fewer tasks per node",
        )
    if cluster.slurm.mem and part.mem_mb and mem_mb(cluster.slurm.mem) > part.mem_mb:
        raise _refuse(
            "slurm.mem",
            cluster.slurm.mem,
            f"the nodes of {where} have {part.mem_mb} MB",
            f"set cluster.slurm.mem={part.mem_mb}M or less",
        )
    if part.max_time_min is not None and cluster.timeout_min > part.max_time_min:
        raise _refuse(
            "timeout_min",
            cluster.timeout_min,
            f"{where} allows at most {part.max_time_min:g} minutes (MaxTime)",
            f"set cluster.timeout_min={part.max_time_min:g} or less, and rely on requeue for longer training",
        )


def check_pack(cluster: ClusterConfig, facts: ClusterFacts, pack: int) -> None:
    """Refuse a pack (``cluster.pack``) whose members together need more of a node than its partition's nodes
    have: each member's tasks x CPUs, GPUs and memory, ``pack`` times over. ConfigError naming cluster.pack."""
    part = facts.partitions.get(cluster.slurm.partition) if cluster.slurm.partition else facts.default_partition
    if pack <= 1 or part is None:
        return
    where = f"partition {part.name}" + (" (the default)" if not cluster.slurm.partition else "")
    cpus = cluster.tasks_per_node * cluster.cpus_per_task
    mem = mem_mb(cluster.slurm.mem) if cluster.slurm.mem else 0
    needs = [  # (what one member takes of a node, what a node has, its unit)
        (cpus, part.cpus, "CPUs"),
        (cluster.gpus_per_node, part.gpus, "GPUs"),
        (mem, part.mem_mb, "MB of memory"),
    ]
    for one, have, unit in needs:
        if one and have and one * pack > have:
            fits = have // one
            fix = (
                f"set cluster.pack={fits} or fewer" if fits > 1 else "set cluster.pack=1 (a member alone fills a node)"
            )
            raise _refuse(
                "pack",
                pack,
                f"{pack} members x {one} {unit} each = {one * pack} {unit} on each node, but the nodes of {where} "
                f"have {have}",
                f"{fix}, or ask less of each member",
            )


_SLURM_WORDS = [
    ("invalid partition", "cluster.slurm.partition"),
    ("invalid account", "cluster.slurm.account"),
    ("invalid qos", "cluster.slurm.qos"),
    ("invalid feature", "cluster.slurm.constraint"),
    ("time limit", "cluster.timeout_min"),
    ("memory specification", "cluster.slurm.mem"),
    ("node count", "cluster.nodes"),
    ("gres", "cluster.gpus_per_node"),
    ("requested node configuration is not available", "cluster.nodes, gpus_per_node, cpus_per_task or mem"),
    ("more processors requested than permitted", "cluster.tasks_per_node or cluster.cpus_per_task"),
]


def explain_slurm_refusal(message: str) -> str:
    """Slurm's words for a refused request, plus the config key to change."""
    lowered = message.lower()
    keys = next((key for words, key in _SLURM_WORDS if words in lowered), None)
    hint = f"change {keys}" if keys else "check the cluster.* values against `python -m hpc_train.profile`"
    return f"{message.strip()}. HINT: {hint} (`python -m hpc_train.profile` shows what each partition offers)"
