"""The package as a user gets it: sdist -> wheel -> a fresh venv, non-editable, run from an empty folder.

Nothing of the checkout is importable there (no PYTHONPATH, another working directory), so the configs, the
Hydra plugins and both entry points (`hpc-train`, `python -m hpc_train`) must all come from the wheel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ..conftest import CONF, REPO
from ..readme_examples import manual_blocks

pytestmark = pytest.mark.slow

TORCH = "torch==2.13.0"  # first, on its own: an unpinned torch would pull GBs of CUDA packages
EXAMPLES = [
    "__init__.py",
    "ddp_tutorial.py",
    "global_batch_loop.py",
    "hf_trainer.py",
    "lightning_script.py",
    "preemptible_loop.py",
    "scvi_script.py",
]
"""hpc_train/examples/: the scripts the README runs and points users to."""
CACHE = Path(os.environ.get("HPC_TRAIN_TEST_CACHE", Path.home() / ".cache" / "hpc-train-tests"))
"""Where the wheel test keeps its venv between sessions (see ``installed``)."""


def sh(*argv: str | Path, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from the sdist, installed the way a user installs it."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    before = {p.name for p in REPO.iterdir()}
    sh(sys.executable, "-m", "build", "--sdist", "--outdir", dist, REPO, cwd=base)
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "from-tree", REPO, cwd=base)
    assert {p.name for p in REPO.iterdir()} <= before, "building wrote into the source tree (build/, *.egg-info)"
    (sdist,) = dist.glob("hpc_train-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}  # below hpc_train-<version>/
    assert "conf/config.yaml" in names, "the sdist lacks the configs (conf/ at the top, as in the repository)"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, sdist, cwd=base)
    (wheel,) = dist.glob("hpc_train-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        shipped = set(whl.namelist())
        shipped_init = whl.read("hpc_train/conf/__init__.py")
    missing = {f"hpc_train/examples/{name}" for name in EXAMPLES} - shipped
    assert not missing, f"the wheel lacks the example scripts: {sorted(missing)}"
    # The top-level conf/ is hpc_train/conf in the wheel: all of it, and its own __init__.py, not the checkout's
    # hpc_train/conf/__init__.py (which only points an import at conf/).
    conf = {f"hpc_train/conf/{p.relative_to(CONF).as_posix()}" for p in CONF.rglob("*") if p.is_file()}
    conf = {n for n in conf if "__pycache__" not in n}
    assert {n for n in shipped if n.startswith("hpc_train/conf/")} == conf
    assert shipped_init == (CONF / "__init__.py").read_bytes()
    return installed(wheel, base)


def installed(wheel: Path, base: Path) -> Path:
    """A venv with ``wheel`` installed as a user installs it: ``pip install torch==2.13.0``, then the wheel.

    Installing torch and the dependencies takes a minute, so the venv is kept in CACHE, keyed by what decides its
    contents besides the wheel itself: the Python, the torch pin and the wheel's Requires-Dist lines. A kept
    venv is used again only if its packages are still exactly those it was made with; the wheel is then
    reinstalled into it (pip removes every file the previous build installed) and ``pip install wheel torch``
    must find every dependency satisfied, as it would in a fresh venv.
    """
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        requires = sorted(line for line in whl.read(metadata).decode().splitlines() if line.startswith("Requires-Dist"))
    key = hashlib.sha256("\n".join([sys.version, TORCH, *requires]).encode()).hexdigest()[:16]
    env_dir, freeze = CACHE / f"venv-{key}", CACHE / f"venv-{key}.freeze"
    python = env_dir / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if freeze.is_file() and packages(python) == freeze.read_text() != "":
        sh(*pip, "--force-reinstall", "--no-deps", wheel, cwd=base)
        sh(*pip, wheel, TORCH, cwd=base)
        return env_dir
    for old in CACHE.glob("venv-*"):  # another key's venv, or this one changed since it was made
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    CACHE.mkdir(parents=True, exist_ok=True)
    sh(sys.executable, "-m", "venv", env_dir, cwd=base)
    sh(*pip, TORCH, cwd=base)
    sh(*pip, wheel, TORCH, cwd=base)
    freeze.write_text(packages(python))
    return env_dir


def packages(python: Path) -> str:
    """The venv's installed distributions and versions, hpc-train aside (it is reinstalled on every use)."""
    argv = [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"]
    try:
        listed = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError):  # no venv there, or a broken one: made anew
        return ""
    return "\n".join(sorted(line for line in listed.splitlines() if not line.startswith("hpc-train=")))


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HPC_TRAIN_CONFIG_PATH")}


def test_installed_integrations_name_their_extra(venv: Path, tmp_path: Path) -> None:
    """The callbacks ship in the wheel; without their framework (not a dependency) they say what to install."""
    for framework in ("transformers", "lightning"):
        argv = [venv / "bin" / "python", "-c", f"import hpc_train.integrations.{framework}"]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=120)
        assert proc.returncode == 1 and f"pip install 'hpc-train[{framework}]'" in proc.stderr, proc.stderr[-2000:]


def test_installed_package_is_not_the_checkout(venv: Path, tmp_path: Path) -> None:
    where = sh(
        venv / "bin" / "python", "-c", "import hpc_train.conf as c; print(c.__file__)", cwd=tmp_path, env=clean_env()
    )
    assert "site-packages" in where and str(REPO) not in where


@pytest.mark.parametrize("entry", ["hpc-train", "python -m hpc_train"])
def test_default_job_from_an_empty_folder(venv: Path, tmp_path: Path, entry: str) -> None:
    argv = [venv / "bin" / "hpc-train"] if entry == "hpc-train" else [venv / "bin" / "python", "-m", "hpc_train"]
    out = sh(*argv, "hydra.run.dir=run", "trainer.progress_bar=false", cwd=tmp_path, env=clean_env())
    assert "job COMPLETED" in out or (tmp_path / "run" / "model_final.pt").is_file(), out[-2000:]
    assert (tmp_path / "run" / "model_final.pt").is_file()
    assert "rank table (attempt 0, 2 ranks)" in out


@pytest.mark.parametrize(
    ("entry", "dry_run"),
    [("hpc-train", "cluster.slurm.dry_run=true"), ("python -m hpc_train", "cluster.dry_run=true")],  # the old name too
)
def test_slurm_dry_run_from_an_empty_folder(venv: Path, tmp_path: Path, entry: str, dry_run: str) -> None:
    argv = [venv / "bin" / "hpc-train"] if entry == "hpc-train" else [venv / "bin" / "python", "-m", "hpc_train"]
    out = sh(*argv, "cluster=slurm", dry_run, "hydra.run.dir=run", cwd=tmp_path, env=clean_env())
    assert "dry run; nothing submitted" in out and "#SBATCH --nodes=1" in out
    assert f"{venv}/bin/python" in (tmp_path / "run" / "job.sbatch").read_text()  # the ranks run the venv's Python


def test_readme_copies_the_examples_out_of_the_wheel(venv: Path, tmp_path: Path) -> None:
    """The manual's one line that copies the example scripts works on an installed wheel."""
    bash = [body for lang, body in manual_blocks() if lang == "bash"]
    (copy,) = [line for body in bash for line in body.splitlines() if "hpc_train.examples as e" in line]
    env = {**clean_env(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    sh("bash", "-c", copy, cwd=tmp_path, env=env)
    assert sorted(p.name for p in (tmp_path / "examples").glob("*.py")) == EXAMPLES
