"""Typed config schema: the defaults and rules live here; ``conf/*.yaml`` (``pkg://hpc_train.conf``) picks options.

Every dataclass checks its own fields in ``__post_init__`` and raises ``ConfigError`` naming the key, the
value and the fix; ``Config.__post_init__`` checks rules that span groups. ``OmegaConf.to_object`` runs these
checks, so a bad value stops ``python -m hpc_train`` before anything is launched. The checks are pure: they
change no value and look at no file, so a saved ``config.yaml`` loads the same on every rank, in the supervisor
and in ``jobs status``. What depends on the submitting machine's files (``script.path``, ``script.command``,
a ``cluster.slurm.python`` with a space) is checked at submission, by ``hpc_train.launch.preflight.check_paths``.

Groups whose options have different fields (``model``, ``optim``) get one schema per option, chosen by the
option's ``name`` (see ``MODEL_SCHEMAS`` / ``OPTIM_SCHEMAS``); ``config_from_dict`` uses the same tables to
rebuild a typed config from the ``config.yaml`` saved in a run directory.

The modules, from the bottom up:

- ``checks``: the bounds values must fit and the ``Checked`` mixin every group's checks use;
- ``sizes``: the memory-size grammar of ``cluster.slurm.mem``;
- ``cluster``, ``training``, ``options``, ``tracking``: the groups' schemas (``cluster`` with its Slurm-only
  ``cluster.slurm``; ``data`` and ``trainer``; ``model`` and ``optim``; the experiment trackers), each with its
  own checks;
- ``schema``: ``Config``, the whole job, with the rules that span groups, ``resolve`` and ``RESUME_SAFE_KEYS``;
- ``load``: ``config_from_dict`` / ``load_config`` and the translation of OmegaConf's errors;
- ``overrides``: the checks of command-line overrides before Hydra composes, and the rewrite of the old flat
  Slurm key names (``cluster.slurm.partition`` -> ``cluster.slurm.partition``);
- ``registry``: ``register_configs``, the schemas in Hydra's ConfigStore.

Import from here: every public name is re-exported.
"""

from __future__ import annotations

from hpc_train.config.checks import (
    FLOAT32_MAX,
    INT32_MAX,
    INT64_MAX,
    SLURM_U16_MAX,
    YEAR_MIN,
    YEAR_S,
    control_character,
    invalid,
)
from hpc_train.config.cluster import (
    GPU_BINDINGS,
    HOSTLIST_KEYS,
    LAUNCHERS,
    MANAGED_SBATCH_FLAGS,
    SLURM_ONLY,
    STOP_SIGNALS,
    SUBMIT_MODES,
    ClusterConfig,
    SlurmConfig,
    StragglerConfig,
    check_python,
    fold_slurm_aliases,
)
from hpc_train.config.load import config_from_dict, environment_keys, load_config
from hpc_train.config.options import (
    MODEL_SCHEMAS,
    OPTIM_SCHEMAS,
    AdamWConfig,
    CNNConfig,
    MLPConfig,
    SGDConfig,
    TransformerConfig,
)
from hpc_train.config.overrides import (
    check_override_keys,
    check_override_syntax,
    check_overrides,
    chosen_option_keys,
    hydra_quoted,
    override_keys,
    script_args_as_one_string,
    slurm_alias_overrides,
)
from hpc_train.config.registry import CONFIG_MODULE, register_configs
from hpc_train.config.schema import RESUME_SAFE_KEYS, Config, ScriptConfig, resolve
from hpc_train.config.sizes import mem_mb
from hpc_train.config.tracking import WANDB_MODES, MlflowConfig, TrackingConfig, WandbConfig
from hpc_train.config.training import (
    DEVICES,
    LR_SCALING,
    PRECISIONS,
    SCHEDULES,
    STRATEGIES,
    DataConfig,
    DDPConfig,
    EarlyStoppingConfig,
    ScheduleConfig,
    TrainerConfig,
)

__all__ = [
    "CONFIG_MODULE",
    "DEVICES",
    "FLOAT32_MAX",
    "GPU_BINDINGS",
    "HOSTLIST_KEYS",
    "INT32_MAX",
    "INT64_MAX",
    "LAUNCHERS",
    "LR_SCALING",
    "MANAGED_SBATCH_FLAGS",
    "MODEL_SCHEMAS",
    "OPTIM_SCHEMAS",
    "PRECISIONS",
    "RESUME_SAFE_KEYS",
    "SCHEDULES",
    "SLURM_ONLY",
    "SLURM_U16_MAX",
    "STOP_SIGNALS",
    "STRATEGIES",
    "SUBMIT_MODES",
    "WANDB_MODES",
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
    "MlflowConfig",
    "SGDConfig",
    "ScheduleConfig",
    "ScriptConfig",
    "SlurmConfig",
    "StragglerConfig",
    "TrackingConfig",
    "TrainerConfig",
    "TransformerConfig",
    "WandbConfig",
    "check_override_keys",
    "check_override_syntax",
    "check_overrides",
    "check_python",
    "chosen_option_keys",
    "config_from_dict",
    "control_character",
    "environment_keys",
    "fold_slurm_aliases",
    "hydra_quoted",
    "invalid",
    "load_config",
    "mem_mb",
    "override_keys",
    "register_configs",
    "resolve",
    "script_args_as_one_string",
    "slurm_alias_overrides",
]
