"""``hpc-train --help``: what a user can type, with the options that exist here, theirs included.

Hydra's own help names the program after its module (``__main__``) and lists the internal ``schema_*``
options beside the real ones; this one lists only the YAML options a user can pick (``--hydra-help`` still
shows Hydra's).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from hpc_train.core.searchpath import ENV_VAR, config_dir_arg, user_config_dirs, user_profile_dir

__all__ = ["config_options", "help_text"]

GROUPS = ("cluster", "model", "data", "optim", "trainer")


def config_options(extra_dirs: list[Path]) -> dict[str, list[str]]:
    """Per group, the options found in hpc_train's configs and in the user's folders (``extra_dirs`` first)."""
    own = files("hpc_train.conf")
    theirs = sorted(
        {d.name for base in extra_dirs if base.is_dir() for d in base.iterdir() if d.is_dir()} - set(GROUPS)
    )
    options: dict[str, set[str]] = {group: set() for group in [*GROUPS, *theirs]}
    for group in options:
        if group in GROUPS:
            options[group] |= {p.name[:-5] for p in (own / group).iterdir() if p.name.endswith(".yaml")}
        for base in extra_dirs:
            options[group] |= {p.stem for p in (base / group).glob("*.yaml")}
    # A group of the user's own (an experiment folder, say) is not in the defaults list: pick it with +group=x.
    return {group if group in GROUPS else f"+{group}": sorted(names) for group, names in options.items()}


def help_text(argv: list[str]) -> str:
    dirs = [*config_dir_arg(argv), *user_config_dirs()]
    groups = "\n".join(f"  {group:8s} {', '.join(names)}" for group, names in config_options(dirs).items())
    searched = "\n".join(f"  {d}" for d in dirs) or "  (none yet)"
    return f"""\
usage: hpc-train [--config-dir DIR] [-m] [group=option ...] [key=value ...]
       python -m hpc_train ...            (the same program)

Compose a training job from hpc_train's configs and yours, check it, and run it: on this machine
(cluster=local, the default), in the foreground for pdb (cluster=debug), or on Slurm (cluster=slurm, or a
cluster profile of yours). Nothing is submitted until the whole config is valid.

Config groups (group=option):
{groups}

Your own options are found first, in:
{searched}
  (--config-dir DIR; the folders in ${ENV_VAR}; {user_profile_dir()} when it exists)

Useful:
  key=value            override any value, e.g. trainer.max_steps=200 cluster.nodes=2
  script.path=train.py [-- ARGS]   run your own torchrun-style script on every rank instead of the built-in
                       trainer (or script.module=pkg.train, script.command=deepliif; script.args='--lr 1e-3')
  trainer.init_from=RUN_DIR        start a new run from an earlier run's weights
  --cfg job            print the composed config and exit
  -m, --multirun       a sweep (trainer.lr=1e-3,3e-3): one Slurm job array on cluster=slurm
  --hydra-help         Hydra's own flags
  python -m hpc_train.profile     what the Slurm cluster offers; --write NAME makes a cluster profile
  python -m hpc_train.jobs status RUN_DIR   follow, cancel and collect jobs

Examples:
  hpc-train                                      # 2-rank DDP on this machine's CPU
  hpc-train cluster=slurm cluster.nodes=2 cluster.gpus_per_node=4 trainer.precision=bf16
  hpc-train --config-dir conf cluster=mycluster model=mymodel"""
