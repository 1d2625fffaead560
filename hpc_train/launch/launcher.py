"""What every launch does: write the run dir's config (``write_config``), claim it (``claim_run_dir``), refuse a
finished or mismatched resume, and hand over to the launcher that ``cluster.launcher`` names (``launch``).
Imported through ``hpc_train.launch``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpc_train.config import RESUME_SAFE_KEYS, Config, config_from_dict, fold_slurm_aliases, resolve
from hpc_train.config.shape import SHAPE_KEYS, same_global_batch
from hpc_train.core import owner
from hpc_train.core.errors import ConfigError
from hpc_train.core.files import atomic_write
from hpc_train.core.identity import JobIdentity
from hpc_train.core.rundir import RunDir
from hpc_train.core.state import RankState, all_ranks
from hpc_train.launch.reshape import record_reshape, reshaped
from hpc_train.launch.state import ACTIVE_STATES, UNREACHABLE, sacct_state, squeue_state
from hpc_train.mirror import Store, read_ledger
from hpc_train.mirror.sync import holds_this_run
from hpc_train.tracking import ensure_runs

TRAINING_LENGTH_KEYS = ("trainer.max_steps", "trainer.max_epochs", "trainer.early_stopping.patience")
"""The keys a resumed run may change that decide how far it trains: a finished run with new values of these
may have more to train."""


def slurm_probe(job_id: str) -> tuple[bool | None, str]:
    """Slurm's view of the job that owns a run dir (``owner.JobProbe``): squeue while it lists the job (a
    finished job stays listed a few minutes), accounting after that. Not listed and no accounting: ended."""
    if shutil.which("squeue") is None:
        return None, "squeue is not installed here, so Slurm could not be asked"
    state = squeue_state(job_id)
    if state in ACTIVE_STATES:
        return True, f"{state} per squeue"
    if state is None or state == UNREACHABLE:
        accounted = sacct_state(job_id)
        if accounted is not None:
            return accounted in ACTIVE_STATES, f"{accounted} per sacct"
        if state == UNREACHABLE:
            return None, "squeue could not reach slurmctld and sacct gave nothing"
        return False, "Slurm no longer lists it"
    return False, f"{state} per squeue"


def claim_run_dir(cfg: Config, run_dir: RunDir) -> owner.Lease:
    """Make this launch the run dir's only owner before anything is written there; ConfigError naming the live
    owner (a launcher, or a Slurm job) otherwise. See ``hpc_train.core.owner``."""
    here = cfg.cluster.launcher == "slurm" and cfg.cluster.slurm.submit == "here"
    launcher = "slurm submit=here" if here else cfg.cluster.launcher
    job = JobIdentity.from_environ()
    facts = {"allocation": job.job_id, "requeue": job.requeues}
    return owner.claim(run_dir.path, launcher, probe=slurm_probe, facts=facts if here else None)


def finished_step(cfg: Config, run_dir: RunDir) -> int | None:
    """The step a finished run in ``run_dir`` ended at, when launching ``cfg`` there would train nothing more;
    None when it may train (or when that cannot be told without the ranks).

    Only claimed when sure: every rank's last status says completed at the same step, whose checkpoint and the
    final weights are on disk, and ``cfg`` differs from the saved config.yaml in none of the keys that decide
    how far a run trains (TRAINING_LENGTH_KEYS) nor in any key a resumed run may not change (those are refused
    by ``write_config``, naming them). A larger trainer.max_steps therefore goes on training."""
    if cfg.script.enabled or not run_dir.config.is_file() or not run_dir.model_final.is_file():
        return None  # a user's script decides for itself whether it has more to do
    statuses = run_dir.rank_statuses()
    world = cfg.cluster.world_size
    if len(statuses) != world or not all_ranks(statuses, world, RankState.COMPLETED):
        return None
    steps = {s.step for s in statuses.values()}
    step = steps.pop() if len(steps) == 1 else None
    if step is None or not run_dir.checkpoint(step).is_file():
        return None
    old = _comparable(run_dir.config.read_text())
    new = _comparable(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    differ = {k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>")}
    if differ - set(RESUME_SAFE_KEYS) or differ & set(TRAINING_LENGTH_KEYS):
        return None
    return step


def finished_message(cfg: Config, run_dir: RunDir, step: int) -> str:
    """What a launch into a finished run dir says instead of starting ranks that have nothing to do."""
    tc = cfg.trainer
    limits = [f"trainer.max_steps={tc.max_steps}"] if tc.max_steps else []
    if tc.epoch_limit:
        limits.append(f"trainer.max_epochs={tc.epoch_limit}")
    if tc.early_stopping.patience:
        limits.append(f"trainer.early_stopping.patience={tc.early_stopping.patience}")
    return (
        f"hpc_train: {run_dir.path} is finished at step {step} ({', '.join(limits)}); nothing to train. Its weights "
        f"are in {run_dir.model_final}. HINT: raise trainer.max_steps / trainer.max_epochs to train longer, or "
        f"start a new run from its weights: leave hydra.run.dir unset and add trainer.init_from={run_dir.path}"
    )


def write_config(
    cfg: Config, run_dir: RunDir, overrides: Sequence[str] | None = None, secret_keys: Sequence[str] = ()
) -> Config:
    """Save the validated config and the overrides that made it; refuse to overwrite a different config (that
    run's record would be lost), or a run dir another launch owns (``hpc_train.core.owner``; a launcher claims
    the run dir first with ``claim_run_dir``). ``overrides=None``: those of the Hydra job running now (none
    outside one). ``secret_keys``: keys whose values came from the environment (``config.environment_keys``):
    the run dir is made private first (``make_private``). Returns the config saved: on another shape than the
    run dir's, with the per-rank batch and accumulation that keep its global batch (``launch.reshape``)."""
    owner.check_free(run_dir.path, slurm_probe)
    _check_folders(run_dir)
    if secret_keys:
        make_private(run_dir.path, secret_keys)
    cfg, reshape = reshaped(cfg, run_dir)
    text = OmegaConf.to_yaml(OmegaConf.structured(resolve(cfg)))  # the numbers the ranks will read
    if run_dir.config.exists() and run_dir.config.read_text() != text:
        _check_resubmission(run_dir, text)
    if run_dir.config.exists() and not cfg.script.enabled:
        _check_something_to_resume(run_dir, cfg.trainer.mirror)
    atomic_write(run_dir.config, lambda f: f.write(text.encode()))
    run_dir.write_overrides(_hydra_overrides() if overrides is None else overrides)
    record_reshape(run_dir, reshape)
    return cfg


def _check_folders(run_dir: RunDir) -> None:
    """The run dir's folders are folders (or links to one): a file or a dangling link at checkpoints/ made
    main start from step 0 and fail at the first save, after training that far. metrics.jsonl is no link."""
    for folder in (run_dir.checkpoints, run_dir.status_dir, run_dir.logs):
        if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            what = "a link to nothing" if folder.is_symlink() else "a file"
            raise ConfigError(
                f"{folder} is {what}, where the run keeps its {folder.name}. HINT: move it away, or make it a "
                f"folder (or a link to one, e.g. on scratch storage: ln -s /scratch/$USER/run1 {folder})"
            )
    if run_dir.metrics.is_symlink():  # rank 0 would refuse it after the rendezvous, with the others waiting
        raise ConfigError(
            f"{run_dir.metrics} is a symbolic link: the run appends its metrics to its own file, never through a "
            f"link. HINT: remove the link (rm {run_dir.metrics}), or put a copy of the file in its place"
        )


def make_private(folder: Path, secret_keys: Sequence[str]) -> None:
    """Make ``folder`` readable by its owner alone (0700), and say why.

    A value read from the environment with ``${oc.env:...}`` (a tracker token in a shared profile, say) is
    resolved before it is validated, so config.yaml, job.sbatch, submitit's pickles and the logs hold it. Rather
    than chase each of those files, the folder that holds them is closed: everything in it, and everything
    written there later, is out of other users' reach. Group and world permissions of files already there do
    not matter once the folder cannot be entered."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
        shown = ", ".join(secret_keys[:4]) + (" ..." if len(secret_keys) > 4 else "")
        print(
            f"hpc_train: {shown} read the environment (${{oc.env:...}}); their values are written into the run's "
            f"files, so {folder} is now readable by you alone (0700)",
            flush=True,
        )


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
    plain = OmegaConf.to_container(OmegaConf.create(text))
    if isinstance(plain, dict) and isinstance(plain.get("cluster"), dict):
        with contextlib.suppress(ConfigError):  # old flat Slurm names as cluster.slurm.*: not a difference each
            plain["cluster"] = fold_slurm_aliases(plain["cluster"])
    flat = _flat(plain)
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
    # Another shape with the same global batch resumes on it (launch.reshape picked the split).
    safe = set(RESUME_SAFE_KEYS) | (set(SHAPE_KEYS) if same_global_batch(old, new) else set())
    fixed = [k for k in differ if k not in safe]
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


def _check_something_to_resume(run_dir: RunDir, mirror: str) -> None:
    """A finished run (model_final.pt) that left no checkpoint, as older versions did, would be trained again
    from step 0 over its own weights and metrics: refuse, and say how to go on from it. A checkpoint in the run's
    mirror counts (the ranks resume from it); a mirror that cannot be read from here is left to the ranks."""
    if run_dir.model_final.exists() and not run_dir.checkpoint_files():
        if mirror:
            try:
                ledger = read_ledger(Store(mirror))
            except Exception as exc:  # noqa: BLE001 - the store's library; the nodes may reach it
                print(f"hpc_train: WARNING: mirror {mirror} could not be read from here ({exc}); the ranks try it")
                return
            held = ledger.checkpoints() if ledger is not None and holds_this_run(ledger, run_dir, mirror) else []
            if held:
                print(
                    f"hpc_train: {run_dir.checkpoints} is empty; the ranks resume from the mirror {mirror} (step {held[-1].step})"
                )
                return
        raise ConfigError(
            f"hydra.run.dir={run_dir.path} holds a finished run with no checkpoint to go on from (it was written "
            f"before runs kept their last step), so this would train it again from step 0 over its "
            f"{run_dir.model_final.name}. HINT: start a new run from its weights: leave hydra.run.dir unset and "
            f"add trainer.init_from={run_dir.path}"
        )


def _hydra_overrides() -> list[str]:
    """The task overrides of the Hydra job running now: a single run's, or a local sweep element's."""
    # Hydra only in a Hydra job: hpc_train.api launches without it
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def launch(cfg: Config, run_dir: RunDir) -> int:
    """Start the job with the launcher ``cfg.cluster.launcher`` names; returns the exit code for the CLI."""
    # submitit only for the launcher the config picks (both modules import this one)
    from hpc_train.launch.local import launch_debug, launch_local
    from hpc_train.launch.slurm import launch_slurm

    if not (cfg.cluster.launcher == "slurm" and cfg.cluster.slurm.dry_run):
        ensure_runs(run_dir, cfg)  # the tracker runs, once, before the first attempt (and a script's variables)
    launchers = {"local": launch_local, "debug": launch_debug, "slurm": launch_slurm}
    return launchers[cfg.cluster.launcher](cfg, run_dir)
