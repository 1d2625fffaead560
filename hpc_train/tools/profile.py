"""``python -m hpc_train.profile``: what this Slurm cluster offers, one row per partition, and a cluster profile.

    python -m hpc_train.profile                                   # the table
    python -m hpc_train.profile --write mycluster [--partition gpu] [--dir DIR]
    hpc-train cluster=mycluster                                   # from any folder

The table comes from ``scontrol show partition`` / ``scontrol show node`` (and ``sacctmgr`` for accounts and
QoS). ``--write`` makes ``DIR/cluster/NAME.yaml`` (DIR: ``~/.config/hpc_train``, searched by hpc-train from
any folder) with the values of the default partition or of ``--partition``, plus the facts of every partition,
so that requests are checked even where Slurm cannot be asked (a dry run on a laptop).
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from hpc_train.core.errors import ExitCode
from hpc_train.core.searchpath import user_config_dirs, user_profile_dir
from hpc_train.core.textutil import format_table
from hpc_train.launch.facts import ClusterFacts, Partition, read_live

__all__ = ["main", "profile_yaml", "table"]

OWN_OPTIONS = ("local", "debug", "slurm")


def _time(minutes: float | None) -> str:
    if minutes is None:
        return "unlimited"
    days, rest = divmod(int(minutes), 1440)
    return (f"{days}-" if days else "") + f"{rest // 60:02d}:{rest % 60:02d}:00"


def _gpus(part: Partition) -> str:
    return f"{part.gpus} ({','.join(part.gpu_types)})" if part.gpu_types else str(part.gpus)


def table(facts: ClusterFacts) -> str:
    """One row per partition: nodes, GPUs per node (with their types), CPUs and memory per node, MaxTime."""
    rows = [
        [
            p.name + ("*" if p.default else ""),
            p.nodes,
            _gpus(p),
            p.cpus,
            f"{p.mem_mb / 1024:.1f}G".replace(".0G", "G"),
            _time(p.max_time_min),
            "yes" if p.default else "",
            p.state,
        ]
        for p in sorted(facts.partitions.values(), key=lambda p: (not p.default, p.name))
    ]
    headers = ["partition", "nodes", "GPUs/node", "CPUs/node", "mem/node", "max time", "default", "state"]
    return format_table(headers, rows)


def profile_yaml(name: str, part: Partition, facts: ClusterFacts, recorded: str) -> str:
    """A cluster profile for ``part``: extends hpc_train's slurm option and records the cluster's facts."""
    tasks = part.gpus or 1
    values = {
        "gpus_per_node": part.gpus,
        "cpus_per_task": max(1, part.cpus // tasks),
        "timeout_min": min(60.0, part.max_time_min) if part.max_time_min is not None else 60.0,
        "slurm": {"partition": part.name},
    }
    body = OmegaConf.to_yaml({**values, "facts": {"recorded": recorded, **facts.to_record()}})
    return (
        f"# Cluster profile {name!r}, written by `python -m hpc_train.profile --write {name}` on {recorded}\n"
        f"# from partition {part.name}: {_gpus(part)} GPUs, {part.cpus} CPUs and {part.mem_mb} MB per node, "
        f"max time {_time(part.max_time_min)}; Slurm {facts.slurm_version or 'of an unknown version'}.\n"
        f"# Use it with `hpc-train cluster={name}`; override anything on the command line (cluster.nodes=2).\n"
        "# Your environment's setup lines are shell, run before training on the compute nodes: under slurm:, add\n"
        '#   setup: ["module load cuda/12.4", "source $HOME/venvs/train/bin/activate"]\n'
        "defaults:\n  - slurm\n  - _self_\n\n" + body
    )


def _pick(facts: ClusterFacts, partition: str | None) -> Partition:
    if partition is None:
        part = facts.default_partition
        if part is None:
            raise SystemExit("hpc_train.profile: the cluster has no default partition. HINT: name one with --partition")
        return part
    if partition not in facts.partitions:
        names = ", ".join(sorted(facts.partitions))
        raise SystemExit(f"hpc_train.profile: --partition {partition}: no such partition. HINT: pick one of: {names}")
    return facts.partitions[partition]


def _write(args: argparse.Namespace, facts: ClusterFacts) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][\w-]*", args.write) or args.write in OWN_OPTIONS:
        raise SystemExit(
            f"hpc_train.profile: --write {args.write!r}: a profile name is letters, digits, '_' and '-', and not one "
            f"of hpc_train's own cluster options ({', '.join(OWN_OPTIONS)}). HINT: e.g. --write mycluster"
        )
    part = _pick(facts, args.partition)
    folder = args.dir or user_profile_dir()
    path = folder / "cluster" / f"{args.write}.yaml"
    if path.exists() and not args.force:
        raise SystemExit(f"hpc_train.profile: {path} exists. HINT: --force replaces it, or pick another name")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_yaml(args.write, part, facts, datetime.now().isoformat(timespec="seconds")))
    print(f"\nwrote {path} (partition {part.name})")
    searched = any(folder.resolve() == d.resolve() for d in user_config_dirs()) or args.dir is None
    config_dir = "" if searched else f"--config-dir {folder} "
    print(f"hpc-train {config_dir}cluster={args.write}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", metavar="NAME", help="write a cluster profile NAME.yaml")
    parser.add_argument("--partition", help="the partition the profile uses (default: the cluster's default)")
    parser.add_argument("--dir", type=Path, help=f"config folder for the profile (default: {user_profile_dir()})")
    parser.add_argument("--force", action="store_true", help="replace an existing profile")
    args = parser.parse_args(argv)
    facts = read_live()
    if facts is None:
        print(
            "hpc_train.profile: Slurm does not answer here (`scontrol show partition` failed or is missing). HINT: "
            "run this on a login node of the cluster",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    print(table(facts))
    print(f"Slurm {facts.slurm_version or 'of an unknown version (sinfo --version did not say)'}")
    if facts.accounts is not None:
        print(f"accounts: {', '.join(facts.accounts)}; QoS: {', '.join(facts.qos or ())}")
    if args.write:
        _write(args, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
