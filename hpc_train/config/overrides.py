"""Command-line overrides, checked before Hydra composes: the syntax Hydra's grammar would reject with an
unhelpful message (``check_override_syntax``), keys neither the schema nor the chosen option files know
(``check_overrides``, ``check_override_keys``), and quoting a value for Hydra (``hydra_quoted``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf

from hpc_train.config.cluster import SLURM_ONLY, ClusterConfig
from hpc_train.config.options import MODEL_SCHEMAS, OPTIM_SCHEMAS
from hpc_train.config.schema import ScriptConfig
from hpc_train.config.tracking import TrackingConfig
from hpc_train.config.training import DataConfig, TrainerConfig
from hpc_train.core.errors import ConfigError
from hpc_train.core.searchpath import config_dir_arg, option_file, user_config_dirs

__all__ = [
    "check_override_keys",
    "check_override_syntax",
    "check_overrides",
    "chosen_option_keys",
    "hydra_quoted",
    "override_keys",
    "slurm_alias_overrides",
]


_TYPED_GROUPS: dict[str, type[Any]] = {
    "cluster": ClusterConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "script": ScriptConfig,
    "tracking": TrackingConfig,
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

    ``cluster.slurm.exclude=node[07-08]`` fails deep in Hydra's parser ("mismatched input '['"): brackets after text
    are not valid there, since brackets start a list. The error here shows the quoted form that works.
    """
    # Hydra's grammar (0.3 s) only to check overrides: a saved config loads without it
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


_SWEEP_FUNCTION = re.compile(r"(choice|range|interval|glob|sort|shuffle|tag|int|float|str|bool|json_str)\(")
_SCRIPT_ARGS = re.compile(r"(\+{0,2}script\.args)=(.*)", re.DOTALL)


def script_args_as_one_string(argv: list[str]) -> list[str]:
    """``script.args=--out x --lr=1e-3``, as the shell leaves ``script.args="--out x --lr=1e-3"``, is one string
    of arguments for the script: it is quoted for Hydra here, whose grammar would read the ``=`` and the commas
    itself. A list (``[...]``), a value already quoted, and a sweep function (``choice(...)``) stay as written."""
    out = []
    for arg in argv:
        match = _SCRIPT_ARGS.fullmatch(arg)
        value = match.group(2) if match else ""
        if match and value and value[0] not in "['\"" and not _SWEEP_FUNCTION.match(value):
            arg = f"{match.group(1)}={hydra_quoted(value)}"
        out.append(arg)
    return out


def check_overrides(argv: list[str], config_dirs: list[Path] | None = None) -> None:
    """Every check of command-line overrides that runs before Hydra composes: the syntax Hydra's grammar would
    reject with an unhelpful message, then keys that neither the schema nor the chosen option files know.
    ``config_dirs``: the user's config folders when not given in ``argv`` (``--config-dir``). ConfigError on
    the first problem."""
    check_override_syntax(argv)

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
    check_override_keys(
        [_canonical(k) for k in keys],
        chosen_option_keys(argv, config_dirs or []),
        added=[_canonical(k) for k in _added_keys(argv)],
    )


_SLURM_ALIAS = re.compile(rf"^([+~]{{0,2}})cluster\.({'|'.join(SLURM_ONLY)})(?=[.=]|$)")


def _canonical(key: str) -> str:
    """``cluster.partition`` (the old flat name) as ``cluster.slurm.partition``; any other key as it is."""
    return _SLURM_ALIAS.sub(r"\1cluster.slurm.\2", key)


def slurm_alias_overrides(argv: list[str]) -> list[str]:
    """``argv`` with the old flat names of the Slurm keys spelled as they are now (``cluster.partition=gpu`` ->
    ``cluster.slurm.partition=gpu``), values untouched, so that Hydra, overrides.json and the resume command
    see one spelling. One key given in both spellings with different values is a ConfigError."""
    out = []
    spelled: dict[str, tuple[str, str]] = {}  # the key as it is now -> (as first typed, its value)
    for arg in argv:
        key, eq, value = arg.partition("=")
        canonical = _canonical(key)
        if eq:
            now, typed = canonical.lstrip("+~"), key.lstrip("+~")
            first, first_value = spelled.setdefault(now, (typed, value))
            if first != typed and first_value != value:
                old = first if first != now else typed
                raise ConfigError(
                    f"{first}={first_value} and {typed}={value} set one key twice: {old} is the old name of {now}. "
                    f"HINT: give it once, as {now}=VALUE"
                )
        out.append(canonical + eq + value)
    return out


_OPTION_GROUPS = {"model": MODEL_SCHEMAS, "optim": OPTIM_SCHEMAS}


def chosen_option_keys(argv: list[str], config_dirs: list[Path]) -> dict[str, dict[str, set[str] | None]]:
    """Per group (model, optim), the options the command line picks (``model=tiny``, ``-m model=a,b``, or the
    default) and the keys each one's YAML file declares, theirs included: ``width`` for a user's
    ``conf/model/tiny.yaml`` holding ``width: 64``. None for an option whose file is not found (Hydra reports
    that itself)."""

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
    # Hydra's grammar (0.3 s) only to check overrides: a saved config loads without it
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
    # Hydra's grammar (0.3 s) only to check overrides: a saved config loads without it
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
            if not close and group == "cluster":  # the Slurm keys are one level down
                close = [f"slurm.{k}" for k in difflib.get_close_matches(field_name, SLURM_ONLY, n=1)]
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
