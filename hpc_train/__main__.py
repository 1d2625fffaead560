"""``python -m hpc_train [group=option ...] [key=value ...]``: compose and validate the config, launch it.

The Hydra run directory is the run directory: the validated config is written there as ``config.yaml`` and
every rank reads it from there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hpc_train.config import (
    CONFIG_MODULE,
    Config,
    check_overrides,
    config_from_dict,
    register_configs,
)
from hpc_train.core.errors import ConfigError, exit_plainly
from hpc_train.core.files import atomic_write
from hpc_train.core.rundir import RunDir

register_configs()


def write_config(cfg: Config, run_dir: RunDir) -> None:
    """Save the validated config; refuse to overwrite a different one (that run's record would be lost)."""
    text = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    if run_dir.config.exists() and run_dir.config.read_text() != text:
        raise ConfigError(
            f"hydra.run.dir={run_dir.path} already holds a run with a different {run_dir.config.name}. HINT: leave "
            "hydra.run.dir unset for a fresh directory, or pick a new one."
        )
    atomic_write(run_dir.config, lambda f: f.write(text.encode()))


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def _app(raw: DictConfig) -> None:
    try:
        cfg = config_from_dict(raw)
        run_dir = RunDir(Path(HydraConfig.get().runtime.output_dir))
        write_config(cfg, run_dir)
    except ConfigError as exc:
        print(f"hpc_train: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

    from hpc_train.launch import launch

    with exit_plainly():
        code = launch(cfg, run_dir)
    if code:
        raise SystemExit(code)


def main() -> None:
    """Console-script entry point (``hpc-train``), the same as ``python -m hpc_train``."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        from hpc_train.cli_help import help_text

        print(help_text(sys.argv[1:]))
        return
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as exc:
        print(f"hpc_train: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _app()


if __name__ == "__main__":
    main()
