"""Experiment trackers (MLflow, Weights & Biases): one tracker run per run dir, every step logged once.

``runs`` creates the runs once and hands them to a user's script as the trackers' own variables; ``log`` is rank
0's logging for the built-in trainer. The trackers' packages are optional extras, imported only when configured.
"""

from __future__ import annotations

from hpc_train.tracking.log import TrackerLog, attempt_note, row_values
from hpc_train.tracking.runs import (
    EXTRAS,
    ensure_runs,
    flat_config,
    missing_packages,
    mlflow_client,
    mlflow_patience,
    script_environment,
    wandb_store,
)

__all__ = [
    "EXTRAS",
    "TrackerLog",
    "attempt_note",
    "ensure_runs",
    "flat_config",
    "missing_packages",
    "mlflow_client",
    "mlflow_patience",
    "row_values",
    "script_environment",
    "wandb_store",
]
