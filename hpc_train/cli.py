"""The command line of ``python -m hpc_train`` / ``hpc-train``: compose and validate the config, launch it.

The Hydra run directory is the run directory: the validated config is written there as ``config.yaml`` and
every rank reads it from there. ``hpc_train/__main__.py`` imports this module inside its Ctrl-C guard.
"""

from __future__ import annotations

import sys
from contextlib import suppress
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hpc_train.config import (
    CONFIG_MODULE,
    check_overrides,
    config_from_dict,
    environment_keys,
    hydra_quoted,
    register_configs,
    script_args_as_one_string,
    slurm_alias_overrides,
)
from hpc_train.core.errors import ConfigError, ExitCode, exit_plainly
from hpc_train.core.rundir import RunDir
from hpc_train.core.searchpath import config_dir_arg
from hpc_train.core.signals import composed
from hpc_train.launch import claim_run_dir, finished_message, finished_step, launch, write_config
from hpc_train.launch.preflight import preflight
from hpc_train.tools.cli_help import help_text


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def _app(raw: DictConfig) -> None:
    try:
        typed = config_from_dict(raw, HydraConfig.get().overrides.task)
        composed()  # the OmegaConf work is done: a Ctrl-C held meanwhile acts here, between two steps of ours
        cfg = preflight(typed)  # checked against this machine and its files; script.path absolute
        run_dir = RunDir(Path(HydraConfig.get().runtime.output_dir))
        # Before anything is written: a second launch into a run dir another one trains in is refused here.
        lease = claim_run_dir(cfg, run_dir)
    except ConfigError as exc:
        _config_error(exc)
    with lease:  # given back when the launch ends, however it ends (a Slurm submission hands it to the job)
        try:
            finished = finished_step(cfg, run_dir)
            if finished is not None:
                print(finished_message(cfg, run_dir, finished), flush=True)
                return
            # The resume command needs the user's config folder as much as the overrides.
            flags = [f"--config-dir={d.resolve()}" for d in config_dir_arg(sys.argv)]
            overrides = [*flags, *HydraConfig.get().overrides.task]
            cfg = write_config(cfg, run_dir, overrides, secret_keys=environment_keys(raw))
        except ConfigError as exc:
            _config_error(exc)

        with exit_plainly():
            try:
                code = launch(cfg, run_dir)
            except KeyboardInterrupt:  # before a launcher took Ctrl-C over: `jobs status` reads STOPPED, not UNKNOWN
                with suppress(OSError):
                    run_dir.write_interrupted("")
                raise
    if code:
        raise SystemExit(code)


def _config_error(exc: ConfigError) -> NoReturn:
    print(f"hpc_train: config error: {exc}", file=sys.stderr)
    raise SystemExit(ExitCode.USAGE) from None


def main() -> None:
    """``hpc-train`` / ``python -m hpc_train``, through ``hpc_train.__main__``, which holds Ctrl-C and SIGTERM from
    before this module is imported until the config is composed (``_app`` says when, or ``__main__`` once this
    returns): registering the schemas and composing run under that one hold."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(help_text(sys.argv[1:]))
        return
    try:
        sys.argv[1:] = script_args_as_one_string(with_passthrough(sys.argv[1:]))
        check_overrides(sys.argv[1:])
        sys.argv[1:] = slurm_alias_overrides(sys.argv[1:])  # after the checks, whose hints keep your spelling
    except ConfigError as exc:
        print(f"hpc_train: config error: {exc}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE) from None
    register_configs()
    _app()


def with_passthrough(argv: list[str]) -> list[str]:
    """The words after a lone ``--`` are the script's arguments, as typed: they become one ``script.args`` list
    override (every element quoted for Hydra), so that a sweep, an array and the resume command keep them."""
    if "--" not in argv:
        return argv
    cut = argv.index("--")
    head, tail = argv[:cut], argv[cut + 1 :]
    if any(a.split("=", 1)[0].lstrip("+") == "script.args" for a in head):
        raise ConfigError("script.args is given twice: as an override and after --. HINT: keep one of the two forms")
    return [*head, "script.args=[" + ",".join(hydra_quoted(a) for a in tail) + "]"]
