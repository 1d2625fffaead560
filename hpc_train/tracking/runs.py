"""One tracker run per run dir: created once, before the first attempt, kept in ``status/trackers.json``, and
reused by every later attempt (a requeue, an in-allocation restart, a resubmission, another shape).

The launchers call ``ensure_runs`` before they start ranks (the local launcher once, the Slurm supervisor at the
start of each allocation); it is idempotent. A user's script gets the runs as the variables the trackers' own
libraries read (``script_environment``), so a Hugging Face Trainer or a Lightning logger continues the run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import string
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from omegaconf import OmegaConf

from hpc_train.config import Config, TrackingConfig
from hpc_train.core.records import TrackerRun
from hpc_train.core.rundir import RunDir

__all__ = [
    "EXTRAS",
    "ensure_runs",
    "flat_config",
    "missing_packages",
    "mlflow_client",
    "mlflow_patience",
    "script_environment",
    "wandb_store",
]

log = logging.getLogger(__name__)

EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}
"""The package each tracker needs, and the extra of hpc-train that installs it."""

# MLflow's client retries a request 7 times with a growing back-off by default: minutes of waiting for a server
# that is down. hpc_train's own calls give up sooner (a tracker must never hold training up).
_MLFLOW_PATIENCE = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}


def missing_packages(tracking: TrackingConfig) -> list[tuple[str, str]]:
    """(key, extra) of each configured tracker whose package is not importable here."""
    wanted = [("tracking.mlflow.uri", "mlflow", tracking.mlflow.enabled)]
    wanted.append(("tracking.wandb.project", "wandb", tracking.wandb.enabled))
    return [(key, EXTRAS[name]) for key, name, on in wanted if on and importlib.util.find_spec(name) is None]


def wandb_store(tracking: TrackingConfig) -> str:
    return f"{tracking.wandb.entity}/{tracking.wandb.project}"


def mlflow_patience() -> dict[str, str]:
    """Shorten MLflow's HTTP timeout and retries in this process, where the user has not set them; returns what
    was set. (MLflow reads them at each request.)"""
    added = {k: v for k, v in _MLFLOW_PATIENCE.items() if k not in os.environ}
    os.environ.update(added)
    return added


@contextlib.contextmanager
def _patience() -> Iterator[None]:
    """``mlflow_patience`` for the calls inside only: the launcher's environment is its ranks' too."""
    added = mlflow_patience()
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def mlflow_client(uri: str) -> Iterator[Any]:
    """An ``MlflowClient`` of ``uri``, whose requests give up after about half a minute."""
    with _patience():
        # the tracker package (an optional extra) only when it is configured
        from mlflow.tracking import MlflowClient

        yield MlflowClient(tracking_uri=uri)


def flat_config(cfg: Config) -> dict[str, str]:
    """The resolved config as dotted keys and their values in text, as trackers take parameters."""

    tree = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    flat: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            flat[prefix] = str(node)

    walk("", tree)
    return flat


def ensure_runs(run_dir: RunDir, cfg: Config) -> list[TrackerRun]:
    """The tracker runs of ``run_dir``, each created now if it has none yet in the store ``cfg`` names. A tracker
    that cannot be reached, or a record that cannot be written, gets one warning and no run here (rank 0 of the
    built-in trainer tries again)."""
    try:
        return _ensure_runs(run_dir, cfg)
    except Exception as exc:  # noqa: BLE001 - trackers never stop a launch or a job
        log.warning("hpc_train: the tracker runs of %s are not set up: %s", run_dir.path, exc)
        return []


def _ensure_runs(run_dir: RunDir, cfg: Config) -> list[TrackerRun]:
    runs = []
    if cfg.tracking.mlflow.enabled:
        run = run_dir.tracker_run("mlflow", cfg.tracking.mlflow.uri) or _from_checkpoints(run_dir, "mlflow", cfg)
        if run is None:
            try:
                run = _create_mlflow_run(run_dir, cfg)
            except Exception as exc:  # noqa: BLE001 - any failure of the tracker: a warning, never the end
                log.warning("hpc_train: could not create the MLflow run at %s: %s", cfg.tracking.mlflow.uri, exc)
        if run is not None:
            runs.append(run)
    if cfg.tracking.wandb.enabled:
        store = wandb_store(cfg.tracking)
        run = run_dir.tracker_run("wandb", store) or _from_checkpoints(run_dir, "wandb", cfg)
        if run is None:
            # W&B takes the id the first wandb.init gives it: no server is needed to make one.
            alphabet = string.ascii_lowercase + string.digits
            run_id = "".join(secrets.choice(alphabet) for _ in range(8))
            run = TrackerRun(tracker="wandb", store=store, run_id=run_id, created=time.time())
            run_dir.write_tracker_run(run)
        runs.append(run)
    return runs


def _from_checkpoints(run_dir: RunDir, tracker: str, cfg: Config) -> TrackerRun | None:
    """The run the checkpoint ledger names for ``tracker`` in the configured store, when the run dir's own record
    is gone: the run is continued rather than a second one begun. MLflow is asked for the latest step it holds
    (the ledger's copy is as of the newest checkpoint, and rows past it may have been logged)."""
    store = cfg.tracking.mlflow.uri if tracker == "mlflow" else wandb_store(cfg.tracking)
    run = next((r for r in run_dir.checkpointed_tracker_runs() if (r.tracker, r.store) == (tracker, store)), None)
    if run is None:
        return None
    if tracker == "mlflow":
        with mlflow_client(store) as client:
            held = [m.step for m in client.get_metric_history(run.run_id, "train_loss")]
        run = replace(run, logged_step=max([*held, run.logged_step or 0]) or None)
    # W&B cannot be asked offline: an online run drops a row below its latest step, but an offline one may then
    # hold the rows logged after that checkpoint twice.
    run_dir.write_tracker_run(run)
    log.warning(
        "hpc_train: %s had no %s run; continuing %s, which the checkpoint ledger names",
        run_dir.trackers,
        tracker,
        run.run_id,
    )
    return run


def _create_mlflow_run(run_dir: RunDir, cfg: Config) -> TrackerRun:
    # the tracker package (an optional extra) only when it is configured
    from mlflow.entities import Param, RunTag
    from mlflow.exceptions import MlflowException

    mc = cfg.tracking.mlflow
    with mlflow_client(mc.uri) as client:
        experiment = client.get_experiment_by_name(mc.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(mc.experiment)
            except MlflowException:  # another run of the sweep made it first
                experiment_id = client.get_experiment_by_name(mc.experiment).experiment_id
        label = " ".join(run_dir.label_overrides()) or run_dir.path.name
        tags = {"hpc_train.run_dir": str(run_dir.path.resolve())}
        created = client.create_run(experiment_id, run_name=label[:250], tags=tags)
        run_id = created.info.run_id
        # The resolved config, once: MLflow's parameters cannot change (a resubmission may change how long to
        # train; the config.yaml in the run dir keeps the latest).
        params = [Param(key[:250], value[:6000]) for key, value in flat_config(cfg).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            client.log_batch(run_id, params=params[start : start + 100])
        client.log_batch(run_id, tags=[RunTag("hpc_train.config", str(run_dir.config))])
    run = TrackerRun(tracker="mlflow", store=mc.uri, run_id=run_id, experiment=mc.experiment, created=time.time())
    run_dir.write_tracker_run(run)
    log.info("hpc_train: MLflow run %s in experiment %r at %s", run_id, mc.experiment, mc.uri)
    return run


def script_environment(run_dir: RunDir, cfg: Config) -> dict[str, str]:
    """The variables a user's script gets so that its own tracker code continues the run dir's runs: MLflow's
    (read by mlflow.start_run, the Hugging Face MLflowCallback) and W&B's (read by wandb.init, WandbLogger)."""
    env: dict[str, str] = {}
    tracking = cfg.tracking
    if tracking.mlflow.enabled:
        env["MLFLOW_TRACKING_URI"] = tracking.mlflow.uri
        env["MLFLOW_EXPERIMENT_NAME"] = tracking.mlflow.experiment
        run = run_dir.tracker_run("mlflow", tracking.mlflow.uri)
        if run is not None:
            env["MLFLOW_RUN_ID"] = run.run_id
    if tracking.wandb.enabled:
        env |= {"WANDB_PROJECT": tracking.wandb.project, "WANDB_MODE": tracking.wandb.mode, "WANDB_RESUME": "allow"}
        if tracking.wandb.entity:
            env["WANDB_ENTITY"] = tracking.wandb.entity
        run = run_dir.tracker_run("wandb", wandb_store(tracking))
        if run is not None:
            env["WANDB_RUN_ID"] = run.run_id
        if "WANDB_DIR" not in os.environ:  # the run's files in the run dir, unless the user put them elsewhere
            env["WANDB_DIR"] = str(run_dir.path)
    return env
