"""``python -m hpc_train [group=option ...] [key=value ...]``: compose and validate the config, launch it.

Everything lives in ``hpc_train.cli``; it is imported here, inside the guard, so that a Ctrl-C while Hydra and
the config are still being imported ends the command with one line instead of a traceback.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point (``hpc-train``), the same as ``python -m hpc_train``."""
    # SIGTERM (kill, a CI runner's timeout) before a launcher has taken it over ends the command as Ctrl-C does,
    # with its one line, rather than killing it mid-way; the local launcher installs its own handler.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        from hpc_train.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:  # before a launcher took over its job's Ctrl-C or SIGTERM (importing, composing)
        print("\nhpc_train: interrupted before the job started; nothing was launched", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
