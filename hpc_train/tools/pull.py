"""``python -m hpc_train.jobs pull MIRROR RUN_DIR``: a mirrored run (``trainer.mirror``) back on a file system.

Every file the mirror's ledger names is downloaded beside its place, checked against the ledger's SHA-256 and
size, and only then moved into place; a file that does not match is left out, with a warning, and the pull ends
with status 1. A file already in the run dir with other bytes is kept as ``<name>.before-pull``: nothing there is
lost. The checkpoints pulled are named in the run dir's checkpoint ledger, so a launch with the same run dir
resumes from the newest of them, and verifies it again as it loads it. ``status/pulled.json`` says where it came
from, so that the run goes on mirroring to that mirror from its new place.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpc_train.core.errors import ExitCode
from hpc_train.core.records import MirrorOrigin
from hpc_train.core.rundir import RunDir
from hpc_train.mirror import Store, read_ledger
from hpc_train.mirror.pull import pull_files
from hpc_train.mirror.store import describe_error

__all__ = ["cmd_pull"]


def cmd_pull(mirror: str, run_dir: Path) -> int:
    # torch only to name the pulled checkpoints in the run dir's ledger
    from hpc_train.train.checkpoint import Checkpoints

    try:
        store = Store(mirror)
        ledger = read_ledger(store)
    except Exception as exc:  # noqa: BLE001 - the store's library: unreachable, no credentials, unknown scheme
        print(f"hpc_train.jobs: mirror {mirror} could not be read: {describe_error(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    if ledger is None or not ledger.files:
        print(f"hpc_train.jobs: {mirror} holds no mirrored run (no {store.path('mirror.json')})", file=sys.stderr)
        return ExitCode.USAGE
    rd = RunDir(run_dir)
    rd.status_dir.mkdir(parents=True, exist_ok=True)
    done = pull_files(store, ledger.files, rd, replace=True)
    rd.write_pulled_from(MirrorOrigin(store=mirror, run=ledger.run, time=time.time()))
    checkpoints = Checkpoints(rd)
    for record in ledger.checkpoints():
        path = rd.path / record.name
        if path.is_file() and record.step is not None:
            checkpoints.adopt_copy(path, record.step, record.sha256, record.size)
    newest = [r for r in ledger.checkpoints() if (rd.path / r.name).is_file()]
    print(
        f"hpc_train.jobs: pulled {len(done.pulled)} file(s) from {mirror} into {rd.path} ({len(done.same)} there "
        "already)" + (f"; it resumes from step {newest[-1].step}" if newest else "; no checkpoint")
    )
    for line in done.damaged:
        print(f"hpc_train.jobs: WARNING: not pulled, damaged in the mirror: {line}", file=sys.stderr)
    return ExitCode.FAILED if done.damaged else ExitCode.OK
