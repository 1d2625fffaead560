"""Hydra registration: the schemas go into Hydra's ConfigStore, under the YAML configs hpc_train ships."""

from __future__ import annotations

import functools

from omegaconf import OmegaConf

from hpc_train.config.options import MODEL_SCHEMAS, OPTIM_SCHEMAS
from hpc_train.config.schema import Config

__all__ = ["CONFIG_MODULE", "register_configs"]

CONFIG_MODULE = "pkg://hpc_train.conf"
"""Where hpc_train's own YAML configs are: inside the package, so an installed wheel finds them from any folder."""


@functools.cache
def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore: ``config_schema`` and one schema per model/optim option.

    Once per process (the nodes never change, and Hydra copies a node each time it loads one): registering took
    about 50 ms, and ``compose_config`` called it for every config it composed."""
    # Hydra only where configs are composed (the CLI, the API): a saved config loads without it
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    # The declared defaults, as written: the checks change no value (cluster.tasks_per_node=0 stays 0 here, so
    # that a profile's gpus_per_node still chooses the task count; config_from_dict resolves it).
    schema = OmegaConf.structured(Config)
    # Mappings whose keys are the user's to choose: Hydra's struct mode would ask for a + before each new key
    # (cluster.slurm.sbatch_args={mail-type: END}). An explicit False here outlives the struct flag Hydra sets
    # above. `cluster` itself is open so that profiles written with the old flat Slurm keys (partition: gpu)
    # still compose; config_from_dict folds them into cluster.slurm and refuses any other key there.
    for open_node in (schema.cluster, schema.cluster.slurm.sbatch_args, schema.cluster.facts):
        OmegaConf.set_struct(open_node, False)
    cs.store(name="config_schema", node=schema)
    # Multirun sweeps go through hpc_train's launcher: one Slurm array, or local runs one after another.
    launcher = {"_target_": "hydra_plugins.hpc_train_launcher.launcher.HpcTrainLauncher"}
    cs.store(group="hydra/launcher", name="hpc_train", node=launcher, provider="hpc_train")
    for name, schema in MODEL_SCHEMAS.items():
        cs.store(group="model", name=f"schema_{name}", node=schema)
    for name, schema in OPTIM_SCHEMAS.items():
        cs.store(group="optim", name=f"schema_{name}", node=schema)
