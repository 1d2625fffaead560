"""Resume a run dir on another shape: fewer or more nodes or tasks per node than the run that wrote it.

The run keeps its global batch (per-rank batch x ranks x accumulation), and with it the learning rate, the
schedule and the step count: ``reshaped`` picks the per-rank batch and accumulation that keep it on the new
number of ranks, before anything is launched, and says so. The trainer's data order follows a global sample
cursor (step x global batch), so the samples of an epoch go on where they stopped, whatever the rank count.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hpc_train.config import Config, load_config
from hpc_train.config.shape import Shape, split_global_batch
from hpc_train.core.errors import ConfigError
from hpc_train.core.records import Reshape
from hpc_train.core.rundir import RunDir

__all__ = ["record_reshape", "reshaped"]


def reshaped(cfg: Config, run_dir: RunDir) -> tuple[Config, Reshape | None]:
    """``cfg`` as it runs in ``run_dir``: when the run dir holds a run of the built-in trainer on another number
    of nodes or tasks per node, with the per-rank batch and accumulation that keep that run's global batch, and
    the change of shape to record once the config is written (``record_reshape``; None: the same shape).
    ConfigError when the global batch cannot be kept (it does not split over the new rank count), and for a
    user's script that does not keep one (``script.global_batch``)."""
    if not run_dir.config.exists():
        return cfg, None
    try:
        saved = load_config(run_dir.config)
    except ConfigError:
        return cfg, None  # the resubmission check names what is wrong with the saved config
    old, new = Shape.of(saved), Shape.of(cfg)
    if (old.nodes, old.tasks_per_node) == (new.nodes, new.tasks_per_node):
        return cfg, None
    if cfg.script.enabled or saved.script.enabled:
        return _script_reshaped(cfg, saved, run_dir)
    if (new.batch_size, new.accumulate) != (old.batch_size, old.accumulate):
        if new.global_batch == old.global_batch:  # you chose the split yourself
            return _noted(cfg, old)
        raise ConfigError(
            f"{run_dir.path} was trained on {old.describe()}; this config is {new.describe()}. A run resumed on "
            "another shape keeps its global batch. HINT: leave trainer.batch_size and "
            "trainer.accumulate_grad_batches as they were (hpc_train then picks them for the new shape), or start "
            "a new run"
        )
    split = split_global_batch(old.global_batch, new.world_size, old.batch_size, old.accumulate)
    if split is None:
        divisors = [w for w in range(1, old.global_batch + 1) if old.global_batch % w == 0 and w <= 4 * old.world_size]
        raise ConfigError(
            f"{run_dir.path} was trained on {old.describe()}, and its global batch of {old.global_batch} does not "
            f"split over {new.world_size} ranks ({new.nodes} x {new.tasks_per_node}). HINT: resume on a rank count "
            f"that divides {old.global_batch} (e.g. {', '.join(map(str, divisors[-4:]))}), or start a new run"
        )
    batch_size, accumulate = split
    out = replace(cfg, trainer=replace(cfg.trainer, batch_size=batch_size, accumulate_grad_batches=accumulate))
    return _noted(out, old)


def _script_reshaped(cfg: Config, saved: Config, run_dir: RunDir) -> tuple[Config, Reshape]:
    """A script's run dir on another shape: only a script that keeps its global batch (``script.global_batch``,
    the same as the run's), which then splits it over the new rank count itself (``hpc_train.global_batch``)."""
    old, new = Shape.of(saved), Shape.of(cfg)
    was = saved.script.global_batch
    if was is None or cfg.script.global_batch != was:
        kept = (
            f"its global batch was script.global_batch={was}; this config says {cfg.script.global_batch}. HINT: "
            f"resume with script.global_batch={was}"
            if was is not None
            else "its script did not keep a global batch (script.global_batch unset), so its batch size and data "
            "order are its own and it would go on with another global batch, without saying so. HINT: resume with "
            f"cluster.nodes={old.nodes} cluster.tasks_per_node={old.tasks_per_node}"
        )
        raise ConfigError(
            f"{run_dir.path} was run by your own script on {old.nodes} x {old.tasks_per_node} "
            f"(cluster.nodes={old.nodes}, cluster.tasks_per_node={old.tasks_per_node}); this config asks for "
            f"{new.nodes} x {new.tasks_per_node}, and {kept}, or start a new run (leave hydra.run.dir unset) and "
            "have your script load its checkpoint from the old run dir"
        )
    return _noted(cfg, old)


def _noted(cfg: Config, old: Shape) -> tuple[Config, Reshape]:
    return cfg, Reshape(was=old.describe(), onto=Shape.of(cfg).describe(), time=time.time())


def record_reshape(run_dir: RunDir, entry: Reshape | None) -> None:
    """Say and record (``status/reshapes.json``) a change of shape ``reshaped`` allowed, once the run dir's
    config.yaml holds it (nothing for None: the run's own shape)."""
    if entry is not None:
        print(f"hpc_train: resuming {run_dir.path} on {entry.onto}; it was trained on {entry.was}", flush=True)
        run_dir.append_reshape(entry)
