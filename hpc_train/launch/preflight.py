"""Checks that need more than the config itself, run once at submission, before anything is submitted or any
rank starts.

Config validation is pure (config in, errors out). These look at the machine, its files and the user's code:
whether the script and the executables named exist (``check_paths``), whether the GPUs and cores a local run
asks for are here, and whether each ``_target_`` accepts the keys configured for it. Each mistake would
otherwise surface on every rank, as a traceback, after start-up. Checks that depend on this machine live here,
not in the config's own validation: a config is also read on the compute nodes, by the supervisor and by
``jobs status``, where this machine and its files are not the ones that matter (a finished run's status does
not depend on its script's executable still being on PATH).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_train.config import Config, check_python, invalid
from hpc_train.core.errors import ConfigError
from hpc_train.tracking import missing_packages

__all__ = [
    "check_cpus",
    "check_devices",
    "check_init_from",
    "check_paths",
    "check_targets",
    "check_trackers",
    "preflight",
    "script_file",
    "usable_cores",
]

_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def preflight(cfg: Config) -> Config:
    """Every pre-launch check; ConfigError naming the key, the value and the fix. Returns ``cfg`` as it is
    launched and saved (``check_paths``: script.path absolute)."""
    cfg = check_paths(cfg)
    check_devices(cfg)
    check_cpus(cfg)
    check_targets(cfg)
    check_init_from(cfg)
    check_trackers(cfg)
    check_mirror(cfg)
    return cfg


def check_trackers(cfg: Config) -> None:
    """Each tracker the config names has its package here: the launcher creates the tracker's run, and the
    ranks log to it (an optional extra of hpc-train, imported only when configured)."""

    for key, extra in missing_packages(cfg.tracking):
        value = cfg.tracking.mlflow.uri if key.startswith("tracking.mlflow") else cfg.tracking.wandb.project
        raise invalid(
            key,
            value,
            f"the {extra} package is not installed in this environment ({sys.executable})",
            f"pip install 'hpc-train[{extra}]' into the environment the job runs in, or remove {key}",
        )


def check_mirror(cfg: Config) -> None:
    """trainer.mirror's store has its fsspec implementation here (s3:// needs s3fs, the s3 extra), and
    trainer.mirror_hook's module can be found (imported by rank 0 only, at its start)."""
    tc = cfg.trainer
    if tc.mirror:
        # fsspec only when a mirror is configured
        import fsspec

        protocol = fsspec.utils.get_protocol(tc.mirror)
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as exc:
            extra = "pip install 'hpc-train[s3]'" if protocol in ("s3", "s3a") else "install fsspec's package for it"
            raise invalid(
                "trainer.mirror", tc.mirror, f"fsspec cannot reach {protocol}:// here ({exc})", f"{extra}, or a path"
            ) from None
    if tc.mirror_hook:
        module = tc.mirror_hook.rpartition(".")[0]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise invalid(
                "trainer.mirror_hook",
                tc.mirror_hook,
                f"no module {module} in this environment ({sys.executable})",
                "install it, or put its folder on PYTHONPATH (rank 0 imports it)",
            )


def check_paths(cfg: Config) -> Config:
    """The checks against this machine's files, at submission (a local run, a Slurm job, a dry run, each element
    of a sweep), never when a saved config is loaded: a Slurm cluster.slurm.python holding a space must be one file
    (not a wrapper, see ``check_python``), script.command an executable on PATH, script.path a file. Returns
    ``cfg`` with script.path made absolute, links resolved: the ranks run it from their own folder."""
    if cfg.cluster.launcher == "slurm":
        check_python(cfg.cluster.slurm.python, is_file=lambda path: Path(path).is_file())
    script = cfg.script
    if script.command and shutil.which(os.path.expanduser(script.command)) is None:
        raise invalid(
            "script.command",
            script.command,
            "not an executable on PATH (nor an executable file)",
            "install it into this environment, or give its full path, e.g. script.command=$HOME/bin/train",
        )
    if not script.path:
        return cfg
    return replace(cfg, script=replace(script, path=script_file(script.path)))


def script_file(path: str) -> str:
    """``script.path`` as the ranks run it: absolute, ``~`` expanded, links resolved; ConfigError when it names
    no file."""
    found = Path(path).expanduser()
    if not found.is_file():
        raise invalid("script.path", path, "no such file", "give the path of your script, e.g. script.path=train.py")
    return str(found.resolve())


def check_init_from(cfg: Config) -> None:
    """trainer.init_from names something that exists (the ranks read it from the same folder)."""
    source = cfg.trainer.init_from
    if source and not Path(source).expanduser().exists():
        raise ConfigError(
            f"trainer.init_from={source!r}: no such file or run dir (from {os.getcwd()}). HINT: give the run dir "
            "of the run to start from, e.g. trainer.init_from=outputs/2026-11-25/10-00-00.000000"
        )


def check_devices(cfg: Config, cuda_count: Callable[[], int] | None = None) -> None:
    """A local or debug run trains on this machine: the GPUs it asks for must be here."""
    if cfg.cluster.launcher == "slurm" or cfg.script.enabled:
        return
    wants = cfg.cluster.gpus_per_node or (1 if cfg.trainer.device == "cuda" or cfg.trainer.strategy == "dp" else 0)
    if not wants:
        return
    if cuda_count is None:
        # torch (2 s) only to count the GPUs a config asks for
        import torch

        cuda_count = torch.cuda.device_count
    have = cuda_count()
    if have >= wants:
        return
    key, value = "trainer.device", str(cfg.trainer.device)
    if cfg.cluster.gpus_per_node:
        key, value = "cluster.gpus_per_node", str(cfg.cluster.gpus_per_node)
    elif cfg.trainer.strategy == "dp":  # DataParallel over no GPU would silently be one process
        key, value = "trainer.strategy", cfg.trainer.strategy
    raise ConfigError(
        f"{key}={value} asks for {wants} GPU(s), but torch sees {have} on this machine "
        f"(cluster.launcher={cfg.cluster.launcher} runs here). HINT: set cluster.gpus_per_node=0 "
        "trainer.device=auto to train on the CPU, or run on GPU nodes with cluster=slurm."
    )


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: what taskset, cgroups or an allocation allow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_cpus(cfg: Config, cores: int | None = None) -> None:
    """A local or debug run trains on this machine: each rank starts cluster.cpus_per_task torch threads (and
    a script gets it as OMP_NUM_THREADS), so one rank may not ask for more cores than this machine gives it."""
    if cfg.cluster.launcher == "slurm":
        return  # Slurm's nodes are checked against the partition's CPUs (launch/facts.py)
    have = usable_cores() if cores is None else cores
    wants = cfg.cluster.cpus_per_task
    if wants <= have:
        return
    raise ConfigError(
        f"cluster.cpus_per_task={wants} asks for {wants} CPU cores per rank, but this machine has {have} usable "
        f"core(s) (cluster.launcher={cfg.cluster.launcher} runs the ranks here, each with cluster.cpus_per_task "
        f"threads). HINT: set cluster.cpus_per_task={have} or less, or train on Slurm nodes with cluster=slurm."
    )


def _target_nodes(cfg: Config) -> Iterator[tuple[str, Mapping[str, Any]]]:
    nodes = {
        "model": cfg.model,
        "data.dataset": cfg.data.dataset,
        "trainer.loss": cfg.trainer.loss,
        "trainer.metric": cfg.trainer.metric,
    }
    for key, node in nodes.items():
        if isinstance(node, Mapping) and isinstance(node.get("_target_"), str):
            yield key, node


def _resolve(path: str) -> Any:
    """The object a ``_target_`` names (``pkg.mod.Class``, ``pkg.mod.func``), imported as the ranks will: they
    run ``python -m ...`` from this folder, so it is on their path even when this is the ``hpc-train`` script."""
    parts = path.split(".")
    sys.path.insert(0, os.getcwd())
    try:
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            try:
                obj: Any = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is not None and not module.startswith(exc.name):
                    raise ImportError(f"importing {module} failed: {exc}") from None  # a module it imports
                continue
            except Exception as exc:  # noqa: BLE001 - the user's module raised while being imported
                raise ImportError(f"importing {module} raised {type(exc).__name__}: {exc}") from None
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    raise ImportError(f"{'.'.join(parts[:cut])!r} has no attribute {attr!r}")
                obj = getattr(obj, attr)
            return obj
    finally:
        sys.path.remove(os.getcwd())
    raise ImportError(f"no module named {parts[0]!r}")


def check_targets(cfg: Config) -> None:
    """Each ``_target_`` can be imported here and accepts every key configured beside it.

    A target that cannot be imported here is refused for a local run (the ranks run here, from this folder)
    and only warned about for Slurm, where setup lines may put it on the path of the compute nodes.
    """
    for key, node in _target_nodes(cfg):
        target = str(node["_target_"])
        try:
            obj = _resolve(target)
        except ImportError as exc:
            hint = "run from the folder that holds your module, or put it on PYTHONPATH"
            if str(exc).startswith("importing "):  # found, but its own import failed
                hint = "fix that error in your module, or install what it imports"
            message = f"{key}._target_={target!r} cannot be imported here ({exc}). HINT: {hint}."
            if cfg.cluster.launcher == "slurm":
                warnings.warn(
                    message + " (Not refused: cluster.slurm.setup may make it importable on the nodes.)", stacklevel=2
                )
                continue
            raise ConfigError(message) from None
        _check_signature(key, target, obj, [str(k) for k in node if str(k) not in _HYDRA_KEYS])


def _check_signature(key: str, target: str, obj: Any, configured: list[str]) -> None:
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return  # a builtin or C extension without a signature: the call itself will tell
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in configured if k not in accepted]
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]} is configured, but {target}() takes no argument {unknown[0]!r}. HINT: its "
            f"arguments are: {', '.join(accepted) or '(none)'}; rename or remove {key}.{unknown[0]}."
        )
