"""The mirror's copies on a local path (``hpc_train.mirror``): what lands is verified and named, what does not is
never named, pruning deletes only what the mirror's ledger names, and the way back checks every byte. The same
code against a real S3 server: tests/runs/test_mirror.py."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from hpc_train.core.errors import ConfigError
from hpc_train.core.records import MirroredFile, MirrorLedger
from hpc_train.core.rundir import RunDir
from hpc_train.mirror import LEDGER, Mirror, Store, read_ledger, restore_newest


def _checkpoint(rd: RunDir, step: int, size: int = 4096) -> MirroredFile:
    """A checkpoint file in the run dir, as its ledger would describe it."""
    data = bytes((step + i) % 251 for i in range(size))
    path = rd.checkpoints / f"step_{step:09d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return MirroredFile(
        name=f"checkpoints/{path.name}", sha256=hashlib.sha256(data).hexdigest(), size=size, time=1.0, step=step
    )


@pytest.fixture
def run(tmp_path: Path) -> tuple[RunDir, str]:
    """A run dir with its status folder, and the mirror's path beside it."""
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    return rd, str(tmp_path / "mirror")


def _mirror(rd: RunDir, url: str, held: list[MirroredFile], keep: int = 2, store: type[Store] = Store) -> Mirror:
    return Mirror(rd, url, keep, lambda: list(held), store)


def test_each_sync_lands_the_newest_checkpoint_and_the_story_verified_and_keeps_as_many(
    tmp_path: Path, run: tuple[RunDir, str]
) -> None:
    rd, url = run
    rd.config.write_text("trainer: {}\n")
    rd.metrics.write_text('{"step": 10}\n')
    held: list[MirroredFile] = []
    mirror = _mirror(rd, url, held)
    for step in (10, 20, 30):
        held.append(_checkpoint(rd, step))
        mirror.sync()
        assert mirror.wait(30) and mirror.error == ""
    ledger = read_ledger(Store(url))
    assert ledger is not None and ledger.run == str(rd.path.resolve())
    assert [f.step for f in ledger.checkpoints()] == [20, 30]  # keep=2: step 10 unnamed, then deleted
    assert sorted(p.name for p in (tmp_path / "mirror" / "checkpoints").iterdir()) == [
        held[1].name[12:],
        held[2].name[12:],
    ]
    for name in ("config.yaml", "metrics.jsonl", held[2].name):
        entry = ledger.named(name)
        assert (
            entry is not None and entry.sha256 == hashlib.sha256((tmp_path / "mirror" / name).read_bytes()).hexdigest()
        )
    status = rd.mirror_state()
    assert status is not None and status.landed == held[2].name and status.landed_step == 30 and not status.error


def test_a_file_that_no_longer_matches_its_ledger_or_reads_back_otherwise_is_never_named(
    run: tuple[RunDir, str], caplog: pytest.LogCaptureFixture
) -> None:
    rd, url = run
    record = _checkpoint(rd, 10)
    (rd.checkpoints / "step_000000010.pt").write_bytes(b"bits flipped since the save")
    mirror = _mirror(rd, url, [record])
    with caplog.at_level(logging.WARNING, logger="hpc_train"):
        mirror.sync()
        assert mirror.wait(30)
    assert "no longer matches its ledger" in mirror.error and url in caplog.text
    ledger = read_ledger(Store(url))
    assert ledger is None or ledger.named(record.name) is None

    class Flipping(Store):
        """A store that gives back other bytes than it was given (a damaged object)."""

        def digest(self, name: str) -> tuple[str, int]:
            sha, size = super().digest(name)
            return ("0" * 64, size) if name.startswith("checkpoints/") else (sha, size)

    good = _checkpoint(rd, 20)
    flipping = _mirror(rd, url, [good], store=Flipping)
    flipping.sync()
    assert flipping.wait(30) and "reads back as" in flipping.error
    ledger = read_ledger(Store(url))
    assert ledger is None or not ledger.checkpoints()
    mirror = _mirror(rd, url, [good])  # the next sync, on a store that works again, lands it
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    assert [f.step for f in read_ledger(Store(url)).checkpoints()] == [20]  # type: ignore[union-attr]


def test_pruning_deletes_only_what_the_mirrors_ledger_names(tmp_path: Path, run: tuple[RunDir, str]) -> None:
    rd, url = run
    foreign = tmp_path / "mirror" / "checkpoints" / "step_000000001.pt"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"someone else's file, in the same folder")
    held = [_checkpoint(rd, step) for step in (10, 20)]
    mirror = _mirror(rd, url, held, keep=1)
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    held.append(_checkpoint(rd, 30))
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    assert foreign.read_bytes() == b"someone else's file, in the same folder"
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["step_000000001.pt", "step_000000030.pt"]


def test_the_way_back_takes_the_newest_whole_checkpoint_and_passes_over_a_damaged_one(
    tmp_path: Path, run: tuple[RunDir, str], caplog: pytest.LogCaptureFixture
) -> None:
    rd, url = run
    held = [_checkpoint(rd, 10), _checkpoint(rd, 20)]
    mirror = _mirror(rd, url, [held[0]])
    mirror.sync()
    assert mirror.wait(30)
    mirror = _mirror(rd, url, held)
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    damaged = tmp_path / "mirror" / held[1].name
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"X")
    back = tmp_path / "back" / "checkpoints"
    back.mkdir(parents=True)
    (back / "step_000000010.pt").write_bytes(b"a file the run's ledger does not name")
    with caplog.at_level(logging.WARNING, logger="hpc_train"):
        found = restore_newest(Store(url), back)
    assert found is not None and found.step == 10 and "is damaged" in caplog.text
    # No temp file, nothing damaged, and the file that was there kept.
    assert sorted(p.name for p in back.iterdir()) == ["step_000000010.pt", "step_000000010.pt.before-mirror"]
    assert (back / "step_000000010.pt.before-mirror").read_bytes() == b"a file the run's ledger does not name"
    assert hashlib.sha256((back / "step_000000010.pt").read_bytes()).hexdigest() == held[0].sha256
    assert restore_newest(Store(str(tmp_path / "empty")), tmp_path / "none") is None


def test_a_damaged_ledger_keeps_what_is_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "m").mkdir()
    whole = MirroredFile(name="checkpoints/step_000000010.pt", sha256="a" * 64, size=1, time=1.0, step=10)
    raw = MirrorLedger(run="/r", files=(whole,)).to_json()
    raw["files"].append({"name": "../../etc/passwd", "sha256": "b" * 64, "size": 1, "time": 1.0})
    (tmp_path / "m" / LEDGER).write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING, logger="hpc_train"):
        found = read_ledger(Store(str(tmp_path / "m")))
    assert found == MirrorLedger(run="/r", files=(whole,)) and "the 1 whole entries" in caplog.text
    (tmp_path / "m" / LEDGER).write_text("{not json")
    assert read_ledger(Store(str(tmp_path / "m"))) is None and "is not JSON" in caplog.text


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("runs/exp1", "must be an absolute path"),
        ("s3:///no-bucket", "must be an absolute path"),
        ("/project/a\nb", "control character"),
    ],
)
def test_a_mirror_nobody_could_find_is_refused_with_the_fix(value: str, says: str) -> None:
    from hpc_train.config import TrainerConfig

    with pytest.raises(ConfigError, match=says) as caught:
        TrainerConfig(mirror=value)
    assert "trainer.mirror" in str(caught.value) and "HINT" in str(caught.value)


def test_pull_brings_a_mirrored_run_back_checked_and_keeps_what_was_there(
    tmp_path: Path, run: tuple[RunDir, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_train.tools.jobs import main
    from hpc_train.train.checkpoint import Checkpoints

    rd, url = run
    rd.config.write_text("trainer: {max_steps: 30}\n")
    held = [_checkpoint(rd, 10), _checkpoint(rd, 20)]
    mirror = _mirror(rd, url, held)
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    back = RunDir(tmp_path / "elsewhere")
    back.path.mkdir()
    back.config.write_text("trainer: {max_steps: 5}\n")  # someone's own file where the pulled one goes
    assert main(["pull", url, str(back.path)]) == 0
    assert "pulled 2 file(s)" in capsys.readouterr().out  # the config and the newest checkpoint (one sync)
    assert back.config.read_text() == rd.config.read_text()
    assert (back.path / "config.yaml.before-pull").read_text() == "trainer: {max_steps: 5}\n"
    assert [(r.step, r.sha256) for r in Checkpoints(back).records()] == [(20, held[1].sha256)]

    assert main(["pull", url, str(back.path)]) == 0  # again: everything there already
    assert "pulled 0 file(s)" in capsys.readouterr().out
    (tmp_path / "mirror" / held[1].name).write_bytes(b"damaged")
    (back.path / held[1].name).unlink()
    assert main(["pull", url, str(back.path)]) == 1
    assert "damaged in the mirror: checkpoints/step_000000020.pt" in capsys.readouterr().err
    assert not (back.path / held[1].name).exists()
    assert main(["pull", str(tmp_path / "nothing"), str(back.path)]) == 2


def test_the_hook_gets_each_verified_file_once_as_it_is_and_a_failure_again(
    run: tuple[RunDir, str], caplog: pytest.LogCaptureFixture
) -> None:
    rd, url = run
    rd.config.write_text("trainer: {}\n")
    given: list[str] = []
    failing = {"config.yaml"}

    def hook(path: Path) -> None:
        if path.name in failing:
            raise OSError(f"the tape robot is busy with {path.name}")
        given.append(str(path.relative_to(rd.path)))

    held: list[MirroredFile] = []
    for where in ("", url):  # the hook alone (no store), then after each copy to the store
        given.clear()
        held[:] = [_checkpoint(rd, 10)]
        mirror = Mirror(rd, where, 2, lambda: list(held), hook=hook, hook_name="lab.copy_out")
        with caplog.at_level(logging.WARNING, logger="hpc_train"):
            mirror.sync()
            assert mirror.wait(30) and mirror.error == ""
        assert given == ["checkpoints/step_000000010.pt"]
        assert "trainer.mirror_hook=lab.copy_out failed on" in caplog.text and "tape robot" in caplog.text
        failing.clear()
        held.append(_checkpoint(rd, 20))
        mirror.sync()
        assert mirror.wait(30)
        assert sorted(given) == ["checkpoints/step_000000010.pt", "checkpoints/step_000000020.pt", "config.yaml"]
        failing.add("config.yaml")
    (rd.checkpoints / "step_000000020.pt").write_bytes(b"changed since its save")
    mirror = Mirror(rd, "", 2, lambda: list(held), hook=hook, hook_name="lab.copy_out")
    given.clear()
    mirror.sync()
    assert mirror.wait(30) and "no longer matches its ledger" in mirror.error and given == []


def test_a_hook_that_cannot_be_found_is_refused_with_the_fix() -> None:
    from hpc_train.runtime.mirroring import resolve_hook

    assert resolve_hook("os.path.basename")(Path("/a/b")) == "b"
    for name in ("os.path.no_such_function", "no_such_module_here.fn", "os.sep"):
        with pytest.raises(ConfigError, match=r"trainer.mirror_hook=.*HINT"):
            resolve_hook(name)


def test_jobs_status_says_what_the_mirror_holds_and_why_its_last_copy_failed(run: tuple[RunDir, str]) -> None:
    from hpc_train.core.records import MirrorStatus
    from hpc_train.tools.jobs import mirror_line

    rd, url = run
    assert mirror_line(rd, 100.0) == ""  # no mirror
    landed = "checkpoints/step_000000040.pt"
    rd.write_mirror_status(MirrorStatus(store=url, time=90.0, landed=landed, landed_step=40, seconds=2.5))
    assert mirror_line(rd, 100.0) == f"{rd.path}: {url} holds step 40 verified (10 s ago); the copy took 2.5 s"
    rd.write_mirror_status(MirrorStatus(store=url, time=95.0, landed=landed, landed_step=40, error="OSError: full"))
    assert mirror_line(rd, 100.0).endswith("holds step 40 verified (5 s ago); the latest copy failed: OSError: full")


def test_a_mirror_holds_one_run_and_another_is_refused_unless_it_was_pulled_from_it(
    tmp_path: Path, run: tuple[RunDir, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_train.tools.jobs import main

    rd, url = run
    first = _mirror(rd, url, [_checkpoint(rd, 10)])
    first.sync()
    assert first.wait(30) and first.error == ""
    before = read_ledger(Store(url))
    other = RunDir(tmp_path / "other")
    other.status_dir.mkdir(parents=True)
    second = _mirror(other, url, [_checkpoint(other, 99)], keep=1)
    second.sync()
    assert second.wait(30) and f"holds the run of {rd.path.resolve()}, not {other.path}" in second.error
    assert read_ledger(Store(url)) == before  # nothing of the first run unnamed, overwritten or pruned
    assert main(["pull", url, str(tmp_path / "moved")]) == 0  # the first run, brought to another place...
    capsys.readouterr()
    moved = RunDir(tmp_path / "moved")
    goes_on = _mirror(moved, url, [_checkpoint(moved, 20)])
    goes_on.sync()  # ...goes on mirroring there
    assert goes_on.wait(30) and goes_on.error == ""
    assert [f.step for f in read_ledger(Store(url)).checkpoints()] == [10, 20]  # type: ignore[union-attr]


def test_a_run_dir_that_lost_its_config_gets_its_story_back_and_nothing_it_holds_is_touched(
    tmp_path: Path, run: tuple[RunDir, str]
) -> None:
    """The supervisor's first step after a scratch purge (``--mirror`` in the job script): the story files that are
    missing come back verified; a file the run dir still has stays as it is; without config.yaml and without a
    mirror that can give it back, the job ends with the fix and trains nothing."""
    from hpc_train.mirror.pull import StoryNotRestored, restore_story

    rd, url = run
    rd.config.write_text("trainer: {max_steps: 30}\n")
    rd.metrics.write_text('{"step": 10}\n')
    (rd.status_dir / "attempts.json").write_text("[]\n")
    mirror = _mirror(rd, url, [_checkpoint(rd, 10)])
    mirror.sync()
    assert mirror.wait(30) and mirror.error == ""
    said: list[str] = []
    assert restore_story(rd, url, said.append) is None and not said  # config.yaml is there: nothing to do
    for path in (rd.config, rd.metrics, rd.checkpoints / "step_000000010.pt"):
        path.unlink()
    (rd.status_dir / "attempts.json").write_text('[{"mine": true}]\n')  # newer than the mirror's: kept
    done = restore_story(rd, url, said.append)
    assert done is not None and sorted(done.pulled) == ["config.yaml", "metrics.jsonl"]
    assert rd.config.read_text() == "trainer: {max_steps: 30}\n" and rd.metrics.read_text() == '{"step": 10}\n'
    assert (rd.status_dir / "attempts.json").read_text() == '[{"mine": true}]\n'
    assert not (rd.checkpoints / "step_000000010.pt").exists()  # the ranks take it from the mirror
    assert "had lost config.yaml, metrics.jsonl (a scratch purge?)" in said[0]

    rd.config.unlink()
    (tmp_path / "mirror" / "config.yaml").write_bytes(b"damaged")
    with pytest.raises(StoryNotRestored, match=r"could not give it back whole.*jobs pull"):
        restore_story(rd, url, said.append)
    assert "not brought back: config.yaml" in said[-1] and not rd.config.exists()
    with pytest.raises(StoryNotRestored, match=r"holds no run.*trained nothing.*HINT"):
        restore_story(rd, str(tmp_path / "empty"), said.append)
    other = RunDir(tmp_path / "other")
    with pytest.raises(StoryNotRestored, match="holds the run of"):
        restore_story(other, url, said.append)


def test_two_elements_of_a_sweep_may_not_share_a_mirror() -> None:
    from hpc_train.config import Config, MLPConfig, SGDConfig, TrainerConfig
    from hpc_train.launch.sweep import _check_own_mirrors

    def element(mirror: str) -> Config:
        return Config(model=MLPConfig(), optim=SGDConfig(), trainer=TrainerConfig(mirror=mirror))

    _check_own_mirrors([element(""), element(""), element("/m/0"), element("/m/1")])
    with pytest.raises(ConfigError, match=r"sweep elements 1 and 2 both have trainer.mirror='/m/1'.*hydra:job.num"):
        _check_own_mirrors([element("/m/0"), element("/m/1"), element("/m/1")])
