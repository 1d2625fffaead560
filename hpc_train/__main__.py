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
from hpc_train.launch.preflight import preflight

register_configs()


_PASSTHROUGH: list[str] | None = None
"""The words after a lone ``--`` on the command line: the user script's arguments (script.args), as typed."""


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def _app(raw: DictConfig) -> None:
    try:
        if _PASSTHROUGH is not None:
            raw.script.args = list(_PASSTHROUGH)
        cfg = config_from_dict(raw)
        preflight(cfg)
        run_dir = RunDir(Path(HydraConfig.get().runtime.output_dir))
        overrides = list(HydraConfig.get().overrides.task)
        write_config(cfg, run_dir, overrides if _PASSTHROUGH is None else [*overrides, "--", *_PASSTHROUGH])
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
    global _PASSTHROUGH
    if "--" in sys.argv[1:]:
        cut = sys.argv.index("--")
        # Hydra's parser would read these as its own flags or overrides: they are the script's, verbatim.
        _PASSTHROUGH, sys.argv[cut:] = sys.argv[cut + 1 :], []
    try:
        check_overrides(sys.argv[1:])
        if _PASSTHROUGH is not None and any(a.startswith(("script.args=", "+script.args=")) for a in sys.argv):
            raise ConfigError(
                "script.args is given twice: as an override and after --. HINT: keep one of the two forms"
            )
    except ConfigError as exc:
        print(f"hpc_train: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        _app()
    except KeyboardInterrupt:  # before a launcher took over its job's Ctrl-C (composing, importing): nothing runs
        print("\nhpc_train: interrupted before the job started; nothing was launched", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
