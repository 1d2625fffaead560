"""``python -m hpc_train [group=option ...] [key=value ...]``: compose and validate the config, launch it.

The Hydra run directory is the run directory: the validated config is written there as ``config.yaml`` and
every rank reads it from there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpc_train.config import (
    CONFIG_MODULE,
    check_overrides,
    config_from_dict,
    register_configs,
)
from hpc_train.core.errors import ConfigError, exit_plainly
from hpc_train.core.rundir import RunDir
from hpc_train.launch import write_config

register_configs()


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
        from hpc_train.tools.cli_help import help_text

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
