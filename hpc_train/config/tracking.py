"""The ``tracking`` group: the experiment trackers rank 0 logs to (MLflow, Weights & Biases), beside TensorBoard
(``trainer.tensorboard``). Each run dir is one tracker run, across every requeue, restart and change of shape;
a user's script gets the variables the trackers' own libraries read."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from hpc_train.config.checks import Checked

__all__ = ["WANDB_MODES", "MlflowConfig", "TrackingConfig", "WandbConfig"]

WANDB_MODES = ("online", "offline")

# MLflow's stores: a tracking server, a database, a folder. A plain path, or sqlite:///x.db (three slashes: a
# path relative to where each process starts), would be a different store on every node.
_SERVER = re.compile(r"^((https?|databricks|databricks-uc|uc)://\S+|databricks|databricks-uc)$")
_DATABASE = re.compile(r"^(postgresql|mysql|mssql)(\+\w+)?://\S+$")
_ABSOLUTE_LOCAL = re.compile(r"^(/[^/]|file:/[^/]|file:///[^/]|sqlite:////[^/])")


@dataclass
class MlflowConfig(Checked):
    """An MLflow run per run dir: rank 0 logs every metrics row (train and validation) with its step, the
    resolved config as parameters and the run dir as a tag."""

    _group: ClassVar[str] = "tracking.mlflow"

    uri: str = ""
    """The tracking store: a server (http://host:5000), a database (postgresql://...) or an absolute local store
    every node sees (file:///shared/mlruns, sqlite:////shared/mlflow.db). Empty: MLflow off."""
    experiment: str = "hpc_train"
    """The experiment the run goes into (created if missing)."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        uri = self.uri
        if uri.startswith(("file:", "sqlite:")) or (uri and ":" not in uri and not _SERVER.match(uri)):
            self._require(
                bool(_ABSOLUTE_LOCAL.match(uri)),
                "uri",
                "a local store must be an absolute path: a relative one is another store on every node and in "
                "every working directory",
                "tracking.mlflow.uri=sqlite:////abs/path/mlflow.db (four slashes) or file:///abs/path/mlruns",
            )
        else:
            self._require(
                not uri or bool(_SERVER.match(uri) or _DATABASE.match(uri)),
                "uri",
                "must be a tracking server (http://host:port), a database URI, or an absolute file:/sqlite: store",
                "tracking.mlflow.uri=http://mlflow.example.org:5000",
            )
        self._require(
            bool(self.experiment.strip()), "experiment", "must name an experiment", "tracking.mlflow.experiment=mnist"
        )

    @property
    def enabled(self) -> bool:
        return bool(self.uri)


@dataclass
class WandbConfig(Checked):
    """A Weights & Biases run per run dir, resumed by its id on every later attempt."""

    _group: ClassVar[str] = "tracking.wandb"

    project: str = ""
    """The W&B project. Empty: W&B off."""
    mode: str = "online"
    """online (to the W&B server; needs a login on the nodes) or offline (files under <run dir>/wandb, to upload
    later with ``wandb sync``)."""
    entity: str = ""
    """The team or user the project belongs to (empty: your default entity)."""

    def __post_init__(self) -> None:
        self._refuse_control_characters()
        self._one_of("mode", WANDB_MODES)
        for key in ("project", "entity"):
            self._require(
                not re.search(r"[/\\#?%:]", getattr(self, key)),
                key,
                "may not hold / \\ # ? % or :",
                f"tracking.wandb.{key}=my-{key}",
            )

    @property
    def enabled(self) -> bool:
        return bool(self.project)


@dataclass
class TrackingConfig(Checked):
    """Experiment trackers (optional extras: ``pip install 'hpc-train[mlflow]'`` / ``'hpc-train[wandb]'``)."""

    _group: ClassVar[str] = "tracking"

    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    @property
    def enabled(self) -> bool:
        return self.mlflow.enabled or self.wandb.enabled
