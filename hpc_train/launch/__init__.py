"""Launchers: take a validated Config and a run directory, start the ranks, report the outcome.

Launchers never import the trainer: every task runs ``hpc_train.worker``, which reads the run directory that
``write_config`` prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_train.config import RESUME_SAFE_KEYS, Config, config_from_dict
from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write
from hpc_train.core.rundir import RunDir

__all__ = ["launch", "write_config"]


def write_config(cfg: Config, run_dir: RunDir, overrides: Sequence[str] | None = None) -> None:
    """Save the validated config and the overrides that made it; refuse to overwrite a different config (that
    run's record would be lost). ``overrides=None``: those of the Hydra job running now (none outside one)."""
    text = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    if run_dir.config.exists() and run_dir.config.read_text() != text:
        _check_resubmission(run_dir, text)
    if run_dir.config.exists() and not cfg.script.enabled:
        _check_something_to_resume(run_dir)
    atomic_write(run_dir.config, lambda f: f.write(text.encode()))
    run_dir.write_overrides(_hydra_overrides() if overrides is None else overrides)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{"trainer.max_steps": 100, ...}``; a mapping that is a value (sbatch_args, a _target_ node)
    stays whole under its own key when it sits at a key in RESUME_SAFE_KEYS."""
    if not isinstance(node, dict) or prefix in RESUME_SAFE_KEYS:
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat |= _flat(value, f"{prefix}.{key}" if prefix else str(key))
    return flat


def _comparable(text: str) -> dict[str, Any]:
    """A saved config, flat, as this version writes it: keys added since it was saved get their defaults, and
    early stopping's ``mode: auto`` is resolved (older versions saved the resolved value)."""
    node = OmegaConf.create(text)
    try:
        if isinstance(node, DictConfig):
            text = OmegaConf.to_yaml(OmegaConf.structured(config_from_dict(node)))
    except ConfigError:
        pass  # compared as it is; the differences are named either way
    flat = _flat(OmegaConf.to_container(OmegaConf.create(text)))
    key = "trainer.early_stopping"
    if flat.get(f"{key}.mode") == "auto":
        flat[f"{key}.mode"] = "min" if flat.get(f"{key}.monitor") == "val_loss" else "max"
    return flat


def _check_resubmission(run_dir: RunDir, text: str) -> None:
    """A run dir that already holds a run may go on with a config that differs only in RESUME_SAFE_KEYS (train
    longer, another partition); any other difference is refused, naming the keys, since the saved run was
    trained with the old values."""
    old, new = (_comparable(t) for t in (run_dir.config.read_text(), text))
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))
    fixed = [k for k in differ if k not in RESUME_SAFE_KEYS]
    if fixed:
        shown = "; ".join(f"{k}: {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}" for k in fixed[:6])
        raise ConfigError(
            f"hydra.run.dir={run_dir.path} already holds a run, and this config differs in what that run was "
            f"trained with ({shown}). HINT: resume with the run's own values (its overrides are in "
            f"{run_dir.overrides}); start a new run (leave hydra.run.dir unset), and add "
            f"trainer.init_from={run_dir.path} to start from its weights. A resumed run may change: "
            "trainer.max_steps, trainer.max_epochs, the logging, checkpoint and timeout keys, and the Slurm "
            "queue keys (partition, account, qos, time)."
        )
    if differ:
        print(f"hpc_train: resuming {run_dir.path} with new values of {', '.join(differ)}", flush=True)


def _check_something_to_resume(run_dir: RunDir) -> None:
    """A finished run (model_final.pt) that left no checkpoint, as older versions did, would be trained again
    from step 0 over its own weights and metrics: refuse, and say how to go on from it."""
    if run_dir.model_final.exists() and not run_dir.checkpoint_files():
        raise ConfigError(
            f"hydra.run.dir={run_dir.path} holds a finished run with no checkpoint to go on from (it was written "
            f"before runs kept their last step), so this would train it again from step 0 over its "
            f"{run_dir.model_final.name}. HINT: start a new run from its weights: leave hydra.run.dir unset and "
            f"add trainer.init_from={run_dir.path}"
        )


def _hydra_overrides() -> list[str]:
    """The task overrides of the Hydra job running now: a single run's, or a local sweep element's."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def launch(cfg: Config, run_dir: RunDir) -> int:
    """Start the job with the launcher ``cfg.cluster.launcher`` names; returns the exit code for the CLI."""
    from hpc_train.launch.local import launch_debug, launch_local
    from hpc_train.launch.slurm import launch_slurm

    launchers = {"local": launch_local, "debug": launch_debug, "slurm": launch_slurm}
    return launchers[cfg.cluster.launcher](cfg, run_dir)
