"""The way back: files a mirror's ledger names, brought into a run dir and checked against the ledger's SHA-256
and size before they take their place. ``jobs pull`` brings a whole run (``hpc_train.tools.pull``); the
supervisor brings back the story of a run dir that a scratch purge emptied while its job waited in the queue
(``restore_story``), and the ranks then resume from the mirror's newest checkpoint."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hpc_train.core.files import file_digest
from hpc_train.core.records import MirroredFile
from hpc_train.core.rundir import RunDir
from hpc_train.mirror.store import Store, describe_error
from hpc_train.mirror.sync import STORY, holds_this_run, other_run, read_ledger

__all__ = ["Pulled", "StoryNotRestored", "pull_files", "restore_story"]


@dataclass
class Pulled:
    """What a pull did, file by file."""

    pulled: list[str] = field(default_factory=list)
    same: list[str] = field(default_factory=list)
    """Already in the run dir with the mirror's bytes."""
    kept: list[str] = field(default_factory=list)
    """In the run dir with other bytes, and left as they are (``replace=False``)."""
    damaged: list[str] = field(default_factory=list)
    """A line for each file the mirror could not give back whole."""


def pull_files(store: Store, records: Iterable[MirroredFile], rd: RunDir, replace: bool) -> Pulled:
    """Each of ``records`` downloaded beside its place in ``rd``, checked, then moved into place. A file there with
    other bytes is kept as ``<name>.before-pull`` when ``replace``, else left as it is and the mirror's not
    pulled: nothing in the run dir is lost either way."""
    done = Pulled()
    for record in records:
        dest = rd.path / record.name
        if dest.is_file() and dest.stat().st_size == record.size and file_digest(dest)[0] == record.sha256:
            done.same.append(record.name)
            continue
        if dest.exists() and not replace:
            done.kept.append(record.name)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.pull")
        try:
            got = store.download(record.name, tmp)
        except Exception as exc:  # noqa: BLE001 - gone or unreadable in the store
            tmp.unlink(missing_ok=True)
            done.damaged.append(f"{record.name}: {describe_error(exc)}")
            continue
        if got != (record.sha256, record.size):
            tmp.unlink(missing_ok=True)
            done.damaged.append(f"{record.name}: {got[1]} bytes with SHA-256 {got[0][:12]}..., not as its ledger says")
            continue
        if dest.exists():
            os.replace(dest, dest.with_name(f"{dest.name}.before-pull"))
        os.replace(tmp, dest)
        done.pulled.append(record.name)
    return done


class StoryNotRestored(RuntimeError):
    """A run dir without its config could not get it back from its mirror; the message says why and the fix."""


def restore_story(rd: RunDir, url: str, say: Callable[[str], None]) -> Pulled | None:
    """Before a job's first rank starts, when ``rd`` has lost its config.yaml: the story files (config.yaml,
    overrides.json, metrics.jsonl, the status ledgers) it lacks, from the run's mirror at ``url``. A run dir whose
    files a scratch purge deleted while its job was queued comes back so; its checkpoints follow through the
    ranks (the trainer resumes from the mirror's newest whole one). Files ``rd`` has are never touched; what was
    brought back, and what was not, is given to ``say``. None when config.yaml is there (nothing to do: the
    ranks look at the mirror for a missing checkpoint themselves). StoryNotRestored, with the fix, when the
    mirror cannot give config.yaml back."""
    if rd.config.is_file():
        return None
    started = time.monotonic()
    try:
        store = Store(url)
        ledger = read_ledger(store)
    except Exception as exc:  # noqa: BLE001 - the store's library: unreachable, no credentials, unknown scheme
        raise _not_restored(rd, url, f"the mirror {url} could not be read: {describe_error(exc)}") from None
    if ledger is None or not ledger.files:
        raise _not_restored(rd, url, f"the mirror {url} holds no run")
    if not holds_this_run(ledger, rd, url):
        raise _not_restored(rd, url, other_run(ledger, rd, url))
    named = {f.name: f for f in ledger.files}
    missing = [named[name] for name in STORY if name in named and not (rd.path / name).is_file()]
    done = pull_files(store, missing, rd, replace=False)
    for line in done.damaged:
        say(f"WARNING: mirror {url}: not brought back: {line}")
    if not rd.config.is_file():
        raise _not_restored(rd, url, f"the mirror {url} could not give it back whole")
    took = time.monotonic() - started
    say(
        f"{rd.path} had lost {', '.join(done.pulled)} (a scratch purge?): brought back verified from the mirror {url} "
        f"in {took:.1f} s"
    )
    return done


def _not_restored(rd: RunDir, url: str, why: str) -> StoryNotRestored:
    return StoryNotRestored(
        f"{rd.config} is gone (a scratch purge while the job waited?), and {why}. This job trained nothing, and "
        "nothing is lost: the mirror keeps what it has. HINT: when the store answers, bring the run back with "
        f"python -m hpc_train.jobs pull {url} {rd.path} and launch it again"
    )
