"""Checkpoints that verify themselves, the divergence guard, and files that are the run's own.

These run the real checkpoint code on real files (torch.save, the ledger, renames); no process group."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from hpc_train.core.errors import Diverged
from hpc_train.core.rundir import RunDir
from hpc_train.train.checkpoint import REQUIRED_KEYS, Checkpoints, NoSpaceError, nonfinite_entries
from hpc_train.train.divergence import DivergenceGuard
from hpc_train.train.stopping import EARLY_STOP_SIGNALS


def _state(step: int, value: float | None = None) -> dict[str, Any]:
    weight = torch.full((64, 64), float(step) if value is None else value)
    state: dict[str, Any] = {key: 0 for key in REQUIRED_KEYS}
    state.update(model={"w": weight}, optimizer={"state": {0: {"exp_avg": weight.clone()}}}, step=step, rng=[])
    return state


def _save(run: RunDir, *steps: int, keep: int = 10) -> Checkpoints:
    store = Checkpoints(run)
    for step in steps:
        store.save(_state(step), step, keep)
    return store


def _flip(path: Path, where: float = 0.5, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    start = int(len(data) * where)
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


def test_a_checkpoint_is_recorded_with_its_digest_and_loads(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    store = _save(run, 5, 10)
    ledger = json.loads(run.checkpoint_ledger.read_text())
    assert [r["file"] for r in ledger["checkpoints"]] == ["step_000000005.pt", "step_000000010.pt"]
    assert ledger["writing"] == [] and all(len(r["sha256"]) == 64 for r in ledger["checkpoints"])
    found = store.newest()
    assert found is not None and found[0].name == "step_000000010.pt" and found[1]["step"] == 10


@pytest.mark.parametrize("where", [0.5, 0.97])
def test_flipped_bits_are_caught_and_the_file_set_aside(tmp_path: Path, where: float) -> None:
    """Review of main: 64 bytes flipped loaded silently (torch does not check tensor CRCs)."""
    run = RunDir(tmp_path)
    store = _save(run, 5, 10)
    _flip(run.checkpoint(10), where)
    found = store.newest()
    assert found is not None and found[1]["step"] == 5
    assert (run.checkpoints / "step_000000010.pt.damaged").is_file() and not run.checkpoint(10).exists()
    assert [r.step for r in store.records()] == [5]


def test_reading_another_runs_checkpoints_moves_nothing(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    store = _save(run, 5, 10)
    _flip(run.checkpoint(10))
    found = store.newest(repair=False)
    assert found is not None and found[1]["step"] == 5
    assert run.checkpoint(10).is_file() and [r.step for r in store.records()] == [5, 10]


def test_keep_one_with_a_damaged_newest_keeps_the_new_checkpoints(tmp_path: Path) -> None:
    """Review of main: keep_checkpoints=1 plus one damaged newer file deleted every new checkpoint right after it
    was written, so each attempt resumed from 0."""
    run = RunDir(tmp_path)
    store = _save(run, 5, 10, keep=1)
    _flip(run.checkpoint(10))
    assert store.newest() is None  # what a resumed rank 0 does: the damaged one is set aside; nothing is left
    store.save(_state(1), 1, keep=1)
    store.save(_state(2), 2, keep=1)
    assert [p.name for p in run.checkpoint_files()] == ["step_000000002.pt"]
    found = store.newest()
    assert found is not None and found[1]["step"] == 2


def test_nonfinite_state_is_never_loaded(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    store = Checkpoints(run)
    store.save(_state(5), 5, 10)
    store.save(_state(10, value=float("nan")), 10, 10)  # written by hand: the trainer refuses to save one
    found = store.newest()
    assert found is not None and found[1]["step"] == 5
    assert nonfinite_entries({"model": {"w": torch.tensor([1.0, float("inf")])}, "n": [torch.ones(2)]}) == ["model.w"]


def _earlier_attempt(run: RunDir) -> None:
    """The rank 0 logs of an attempt before this one, and of this one (what the trainer's rank 0 sees)."""
    run.logs.mkdir(parents=True, exist_ok=True)
    (run.logs / "rank_0.log").write_text("attempt 0\n")
    (run.logs / "rank_0.restart1.log").write_text("attempt 1\n")


def test_a_run_dir_from_before_the_ledger_still_resumes(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    _earlier_attempt(run)
    for step in (5, 10):
        torch.save(_state(step), run.checkpoint(step))
    run.checkpoint(10).write_bytes(b"cut short")
    found = Checkpoints(run).newest()
    assert found is not None and found[1]["step"] == 5 and (run.checkpoints / "step_000000010.pt.damaged").is_file()


def test_the_checkpoint_resumed_from_before_the_ledger_is_adopted(tmp_path: Path) -> None:
    """Review: with steps 100 and 200 from before the ledger, a resumed run that saved 300, which then got damaged,
    restarted from 0 although 200 was intact."""
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    _earlier_attempt(run)
    for step in (100, 200):
        torch.save(_state(step), run.checkpoint(step))
    store = Checkpoints(run)
    found = store.newest()
    assert found is not None and found[1]["step"] == 200
    store.save(_state(300), 300, keep=2)
    _flip(run.checkpoint(300))
    again = store.newest()
    assert again is not None and again[1]["step"] == 200
    assert run.checkpoint(100).is_file(), "an older unrecorded checkpoint is never deleted"


def test_a_new_run_never_loads_checkpoints_it_did_not_write(tmp_path: Path) -> None:
    """A new run whose checkpoints/ links to scratch that holds another run's step files starts from 0."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    torch.save(_state(50), scratch / "step_000000050.pt")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.checkpoints.symlink_to(scratch)
    (run.logs).mkdir()
    (run.logs / "rank_0.log").write_text("this attempt\n")
    assert Checkpoints(run).newest() is None
    assert (scratch / "step_000000050.pt").is_file()


def test_the_ledger_of_another_run_dir_is_not_ours(tmp_path: Path) -> None:
    other = RunDir(tmp_path / "other")
    _save(other, 5)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.status_dir.symlink_to(other.status_dir)  # a status/ shared by mistake
    assert Checkpoints(run).records() == []


def test_a_file_that_matches_its_digest_but_will_not_load_is_not_set_aside(tmp_path: Path) -> None:
    """The bytes are those written: a load that fails here (memory, another torch) fails the attempt, and the
    checkpoint stays for the next one."""
    run = RunDir(tmp_path)
    store = _save(run, 5)
    garbage = b"not a zip file at all"
    run.checkpoint(5).write_bytes(garbage)
    import hashlib

    record = json.loads(run.checkpoint_ledger.read_text())
    record["checkpoints"][0].update(sha256=hashlib.sha256(garbage).hexdigest(), size=len(garbage))
    run.checkpoint_ledger.write_text(json.dumps(record))
    with pytest.raises(RuntimeError, match="matches its recorded SHA-256 but cannot be loaded here"):
        store.newest()
    assert run.checkpoint(5).is_file() and [r.step for r in store.records()] == [5]


def test_a_private_run_dir_keeps_its_checkpoints_private(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir(mode=0o700)
    _save(run, 5)
    assert run.checkpoint(5).stat().st_mode & 0o077 == 0


def test_pruning_deletes_only_our_own_files(tmp_path: Path) -> None:
    """checkpoints/ linked to shared scratch: pruning there deleted step_*.pt files this run never wrote."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for name in ("step_000000001.pt", "step_000000007.pt"):
        (scratch / name).write_bytes(b"someone else's")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.checkpoints.symlink_to(scratch)
    store = _save(run, 5, 10, 15, keep=1)
    assert sorted(p.name for p in scratch.iterdir()) == ["step_000000001.pt", "step_000000007.pt", "step_000000015.pt"]
    found = store.newest()
    assert found is not None and found[1]["step"] == 15  # foreign files are never loaded either


def test_a_foreign_file_at_our_name_is_kept_not_overwritten(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    run.checkpoint(5).write_bytes(b"planted")
    _save(run, 5)
    kept = list(run.checkpoints.glob("step_000000005.pt.not-ours-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"planted"


def test_leftovers_of_killed_writers_are_removed_and_only_those(tmp_path: Path) -> None:
    run = RunDir(tmp_path)

    def die_halfway(state: Any, f: IO[bytes]) -> None:
        f.write(b"\0" * 4096)
        raise KeyboardInterrupt  # stands for SIGKILL: nothing after this line runs

    _save(run, 5)
    with pytest.raises(KeyboardInterrupt):
        Checkpoints(run, die_halfway).save(_state(10), 10, 10)
    # A KeyboardInterrupt is no OSError: the temp file stays, named in the ledger, as after a SIGKILL.
    assert (run.checkpoints / ".step_000000010.pt.tmp").is_file()
    assert json.loads(run.checkpoint_ledger.read_text())["writing"] == [".step_000000010.pt.tmp"]
    other = run.checkpoints / ".someone.tmp"
    other.write_bytes(b"x")
    removed = Checkpoints(run).clean_leftovers()
    assert [p.name for p in removed] == [".step_000000010.pt.tmp"] and other.is_file()
    assert json.loads(run.checkpoint_ledger.read_text())["writing"] == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A real file system of 256 KiB (tmpfs): writes past it fail with ENOSPC, as on a full scratch disk."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_says_so_and_names_the_intact_checkpoint(small_disk: Path) -> None:
    """Review of main: a full disk was reported as 'unexpected pos 425088 vs 425040'."""
    run = RunDir(small_disk / "run")
    store = _save(run, 5)
    big = _state(10)
    big["model"]["w"] = torch.zeros(512, 512)  # 1 MiB: more than the disk holds
    with pytest.raises(NoSpaceError, match="no space left on device") as caught:
        store.save(big, 10, 10)
    assert str(run.checkpoint(10)) in str(caught.value) and str(run.checkpoint(5)) in str(caught.value)
    assert not list(run.checkpoints.glob(".*.tmp")) and run.checkpoint_files() == [run.checkpoint(5)]
    found = store.newest()
    assert found is not None and found[1]["step"] == 5


def test_a_link_at_the_temp_name_is_not_written_through(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run.checkpoints.mkdir()
    (run.checkpoints / ".step_000000005.pt.tmp").symlink_to(victim)
    _save(run, 5)
    assert victim.read_text() == "precious" and run.checkpoint(5).is_file()


def _guard_run(guard: DivergenceGuard, losses: list[float], skipped: list[bool] | None = None) -> int:
    """Feed per-step losses as the trainer does (flag, then vote the step before); the step it raised at."""
    for step, loss in enumerate(losses, start=1):
        skip = None if skipped is None else torch.tensor(skipped[step - 1])
        guard.flag(step, torch.tensor(loss), skip)
        guard.agreed(*guard.vote())  # one rank: what is voted is what is agreed
    for _ in range(2):
        guard.agreed(*guard.vote(final=True))
    return 0


def test_divergence_needs_tolerance_bad_steps_in_a_row() -> None:
    nan = float("nan")
    with pytest.raises(Diverged, match="from step 3"):
        _guard_run(DivergenceGuard(1), [1.0, 0.9, nan, 0.8])
    with pytest.raises(Diverged, match="2 step"):
        _guard_run(DivergenceGuard(2), [1.0, nan, 0.9, float("inf"), nan, 0.8])
    _guard_run(DivergenceGuard(2), [1.0, nan, 0.9, nan, 0.8])  # never two in a row
    _guard_run(DivergenceGuard(0), [nan, nan, nan])  # off


def test_divergence_on_the_last_step_is_caught() -> None:
    with pytest.raises(Diverged, match="from step 3"):
        _guard_run(DivergenceGuard(1), [1.0, 0.9, float("nan")])


def test_steps_the_grad_scaler_skipped_are_not_divergence() -> None:
    inf = float("inf")
    _guard_run(DivergenceGuard(1), [1.0, inf, inf, 0.9], skipped=[False, True, True, False])
    with pytest.raises(Diverged):
        _guard_run(DivergenceGuard(1), [1.0, inf], skipped=[False, False])


def test_a_hang_up_is_a_stop_signal_and_every_allowed_signal_is_caught_from_the_first_line() -> None:
    import signal

    from hpc_train.config import STOP_SIGNALS

    assert signal.SIGHUP in EARLY_STOP_SIGNALS
    assert {signal.Signals[f"SIG{name}"] for name in STOP_SIGNALS} <= set(EARLY_STOP_SIGNALS)


def test_clearing_statuses_leaves_records_that_are_not_ours(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    foreign = {"rank": 0, "state": "running", "run": "/elsewhere/run"}
    (shared / "rank_0.json").write_text(json.dumps(foreign))
    (shared / "rank_1.json").write_text(json.dumps({"rank": 1, "state": "running"}))  # no owner named
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.status_dir.symlink_to(shared)
    run.write_status(2, "running")
    run.clear_statuses()
    assert sorted(p.name for p in shared.iterdir()) == ["rank_0.json", "rank_1.json"]

    own = RunDir(tmp_path / "own")
    own.write_status(0, "running")
    (own.status_dir / "rank_1.json").write_text(json.dumps({"rank": 1, "state": "running"}))  # an older version's
    own.clear_statuses()
    assert not list(own.status_dir.glob("rank_*.json"))
