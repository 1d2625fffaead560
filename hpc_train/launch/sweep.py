"""Multirun (``-m``) sweeps: one Slurm job array for ``cluster=slurm``, one job after another otherwise.

Every element is composed and validated before anything is submitted, gets its own run directory (Hydra's
sweep dir / subdir) with its own ``config.yaml``, and the whole sweep is submitted once, so the command returns
as soon as Slurm has the array (hydra#2479: sweeps that block the terminal until every job ends).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from hpc_train.config import Config, config_from_dict, environment_keys
from hpc_train.core.errors import ConfigError, exit_plainly
from hpc_train.core.rundir import RunDir
from hpc_train.core.searchpath import config_dir_arg
from hpc_train.core.signals import composed, held
from hpc_train.launch.preflight import check_paths, preflight

__all__ = ["launch_sweep"]


def _element_configs(
    hydra_context: HydraContext, config: DictConfig, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[DictConfig]:
    configs = []
    for index, overrides in enumerate(job_overrides):
        with held():  # a Ctrl-C waits for this element (OmegaConf cut halfway fails with an error of its own)
            sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"{initial_job_idx + index}"
                sweep_config.hydra.job.num = initial_job_idx + index
        configs.append(sweep_config)
    return configs


def _run_dir(sweep_config: DictConfig) -> RunDir:
    HydraConfig.instance().set_config(sweep_config)  # resolves ${hydra.job.num} and friends in the subdir
    return RunDir(Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir))


def launch_sweep(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    config: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> list[JobReturn]:
    """Hydra's Launcher.launch for hpc_train."""
    setup_globals()
    composed()  # the primary config is composed: from here a Ctrl-C waits for one element at most
    sweep_configs = _element_configs(hydra_context, config, job_overrides, initial_job_idx)
    with exit_plainly(" in the sweep"):
        # every element, before the first runs
        typed = []
        for c, o in zip(sweep_configs, job_overrides, strict=True):
            HydraConfig.instance().set_config(c)  # the element's own ${hydra:job.num} and friends, as run_job would
            with held():
                typed.append(check_paths(config_from_dict(c, o)))
        _check_own_mirrors(typed)
        if typed and typed[0].cluster.launcher == "slurm" and typed[0].cluster.slurm.submit != "here":
            _check_one_request(typed)
            for element in typed:
                preflight(element)
            return _submit_array(typed, sweep_configs, job_overrides)
    # Local sweeps (and sweeps in an allocation this shell holds, cluster.slurm.submit=here) run one after another,
    # each exactly like a single `python -m hpc_train` run.
    returns = []
    for sweep_config in sweep_configs:
        returns.append(
            run_job(
                hydra_context=hydra_context,
                task_function=task_function,
                config=sweep_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
        )
    return returns


def _check_one_request(typed: list[Config]) -> None:
    """One array shares one resource request, so every element must ask for the same cluster."""
    first = _request(typed[0])
    for index, cfg in enumerate(typed[1:], start=1):
        request = _request(cfg)
        differing = sorted(k for k, v in request.items() if first[k] != v)
        if differing:
            key = differing[0]
            raise ConfigError(
                f"sweep element {index} has {key}={request[key]!r} but element 0 has {first[key]!r}, and one "
                "Slurm array shares one request. HINT: sweep cluster.* keys in separate commands."
            )


def _check_own_mirrors(typed: list[Config]) -> None:
    """A mirror holds one run (``hpc_train.mirror``): two elements of a sweep must not share one."""
    first: dict[str, int] = {}
    for index, cfg in enumerate(typed):
        url = cfg.trainer.mirror
        if url and url in first:
            raise ConfigError(
                f"sweep elements {first[url]} and {index} both have trainer.mirror={url!r}, and a mirror holds one "
                "run: the second would find the first's there and copy nothing. HINT: give each element its own, "
                "e.g. trainer.mirror='s3://bucket/runs/${hydra:job.num}' (quoted: the shell must not expand it)"
            )
        first.setdefault(url, index)


def _request(cfg: Config) -> dict[str, Any]:
    """The cluster keys of ``cfg``, dotted (``cluster.slurm.partition``)."""
    cluster = asdict(cfg.cluster)
    slurm = cluster.pop("slurm")
    return {f"cluster.{k}": v for k, v in cluster.items()} | {f"cluster.slurm.{k}": v for k, v in slurm.items()}


def _submit_array(
    typed: list[Config], sweep_configs: list[DictConfig], job_overrides: Sequence[Sequence[str]]
) -> list[JobReturn]:
    # hpc_train.launch imports this module (the Hydra launcher plugin)
    from hpc_train.launch import claim_run_dir, make_private, write_config
    from hpc_train.launch.slurm import submit_slurm

    run_dirs = [_run_dir(c) for c in sweep_configs]
    flags = [f"--config-dir={d.resolve()}" for d in config_dir_arg(sys.argv)]  # for each resume command
    sweep_dir = Path(str(sweep_configs[0].hydra.sweep.dir))
    with ExitStack() as leases:  # each element's run dir is claimed before its config is written (core.owner)
        for cfg, rd in zip(typed, run_dirs, strict=True):
            leases.enter_context(claim_run_dir(cfg, rd))
        secret_keys = sorted({key for c in sweep_configs for key in environment_keys(c)})
        if secret_keys:  # the array's sbatch script is written there
            make_private(sweep_dir / "slurm", secret_keys)
        for cfg, rd, overrides in zip(typed, run_dirs, job_overrides, strict=True):
            write_config(cfg, rd, [*flags, *overrides], secret_keys=secret_keys)
        job_ids = submit_slurm(
            typed[0],
            run_dirs,
            log_dir=sweep_dir / "slurm",
            overrides=job_overrides,
            mirrors=[c.trainer.mirror for c in typed],
        )
    if job_ids:
        array_id = job_ids[0].split("_")[0]
        jobs = len(dict.fromkeys(job_ids))
        if jobs < len(job_ids):  # cluster.pack
            how = f"in {jobs} pack(s) of up to {typed[0].cluster.pack}, as Slurm job {'array ' * (jobs > 1)}{array_id}"
        else:
            how = f"as Slurm job array {array_id}"
        print(f"hpc_train: submitted {len(job_ids)} runs {how}. Sweep dir: {sweep_dir}")
        print(f"  collect: python -m hpc_train.jobs collect {sweep_dir}")
        print(f"  cancel:  python -m hpc_train.jobs cancel {array_id}", flush=True)
    returns = []
    for index, (sweep_config, overrides) in enumerate(zip(sweep_configs, job_overrides, strict=True)):
        ret = JobReturn(
            overrides=list(overrides), cfg=sweep_config, hydra_cfg=sweep_config, working_dir=str(run_dirs[index].path)
        )
        ret.status = JobStatus.COMPLETED
        ret.return_value = job_ids[index] if job_ids else None
        returns.append(ret)
    return returns
