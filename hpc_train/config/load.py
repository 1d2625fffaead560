"""From a mapping to a typed ``Config``: ``config_from_dict`` (a composed config, or a saved ``config.yaml`` read
by ``load_config``) merges it into the schemas, turns OmegaConf's errors into ``ConfigError`` naming the key,
and returns the validated config with its derived values filled in (``resolve``).

Loading does no I/O beyond reading the file it is given, and changes nothing it was given: it runs on every
rank, in the supervisor and in ``jobs status``, where the machine and its files are not the submitter's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpc_train.config.cluster import SLURM_ONLY, ClusterConfig, fold_slurm_aliases
from hpc_train.config.options import MODEL_SCHEMAS, OPTIM_SCHEMAS
from hpc_train.config.schema import Config, resolve
from hpc_train.core.errors import ConfigError

__all__ = ["config_from_dict", "environment_keys", "load_config"]


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
    return OmegaConf.merge(_schema(schemas[name]), node)


_SCHEMAS: dict[type[Any], DictConfig] = {}


def _schema(cls: type[Any]) -> DictConfig:
    """``OmegaConf.structured(cls)``, built once per process (about 25 ms for ``Config``; every rank, the
    supervisor and ``jobs status`` load configs). ``OmegaConf.merge`` copies its first argument, so the node it
    returns is never changed."""
    node = _SCHEMAS.get(cls)
    if node is None:
        node = _SCHEMAS[cls] = OmegaConf.structured(cls)
    return node


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


def config_from_dict(data: Mapping[str, Any] | DictConfig, given: Sequence[str] = ()) -> Config:
    """Validate a plain or OmegaConf mapping (e.g. a loaded ``config.yaml``) into a typed, resolved ``Config``.

    Unknown keys, wrong types and broken rules raise ``ConfigError``. Neither ``data`` nor anything else is
    changed, and no file is looked at: ``hpc_train.launch.preflight.check_paths`` checks paths at submission.
    The old flat names of the Slurm keys (``cluster.partition``) are folded into ``cluster.slurm``; ``given``:
    the command line's overrides, whose values beat a file's when both spellings are set.
    """

    try:
        node = data if isinstance(data, DictConfig) else OmegaConf.create(dict(data))
        node = _folded(OmegaConf.masked_copy(node, [str(k) for k in node if k != "hydra"]), given)
        typed = OmegaConf.merge(_schema(Config), node)
        typed.model = _typed_option(node.get("model"), "model", MODEL_SCHEMAS)
        typed.optim = _typed_option(node.get("optim"), "optim", OPTIM_SCHEMAS)
        if isinstance(typed, DictConfig):
            _refuse_added_keys(typed)
        config = OmegaConf.to_object(typed)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    assert isinstance(config, Config)
    return resolve(config)


def _folded(node: DictConfig, given: Sequence[str]) -> DictConfig:
    """``node`` with the old flat Slurm keys of its ``cluster`` moved into ``cluster.slurm`` (a copy; ``node``
    itself when it holds none)."""
    cluster = node.get("cluster")
    if not isinstance(cluster, DictConfig) or not any(key in cluster for key in SLURM_ONLY):
        return node
    keys = [re.sub(r"^[+~]+", "", g.split("=", 1)[0]) for g in given]
    plain = OmegaConf.to_container(node, resolve=False)
    assert isinstance(plain, dict)
    plain["cluster"] = fold_slurm_aliases(plain["cluster"], keys)
    return OmegaConf.create(plain)


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
    # In cluster, the Slurm keys are one level down: cluster.partiton is closest to slurm.partition.
    offered = [*valid, *(f"slurm.{k}" for k in SLURM_ONLY)] if schema is ClusterConfig else valid
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], offered, n=1)
    if not close and schema is ClusterConfig:
        close = [f"slurm.{k}" for k in difflib.get_close_matches(key.rsplit(".", 1)[-1], SLURM_ONLY, n=1)]
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown config key {key!r}. HINT: {hint}valid keys here: {', '.join(valid)}."


def _refuse_added_keys(node: DictConfig, prefix: str = "") -> None:
    """No typed node holds a key its schema lacks. Hydra's ``+trainer.typo=1`` adds one to a structured node,
    and merging and ``to_object`` would carry it along unread; a plain mapping's keys (your ``_target_``'s
    arguments, cluster.slurm.sbatch_args) are yours to choose."""
    schema: Any = OmegaConf.get_type(node)
    names = {f.name for f in fields(schema)} if is_dataclass(schema) else None
    for key in map(str, node):
        where = f"{prefix}{key}"
        if names is not None and key not in names:
            raise ConfigError(_unknown_key_message(where, schema))
        if not OmegaConf.is_interpolation(node, key) and isinstance(node[key], DictConfig):
            _refuse_added_keys(node[key], f"{where}.")


def load_config(path: str | Path) -> Config:
    """Read and validate a saved ``config.yaml`` (what a worker does in its run directory)."""
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of config groups, found a list")
    return config_from_dict(node)
