"""hpc_train.runtime.script_boot runs a script as `python script.py` would, and frees distributed state at exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def boot(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.runtime.script_boot", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_script_sees_its_argv_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "helper.py").write_text("VALUE = 42\n")
    (folder / "train.py").write_text(
        "import json, sys\nimport helper\nprint(json.dumps([__name__, sys.argv, helper.VALUE]))\n"
    )
    proc = boot(str(folder / "train.py"), "--lr", "0.1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["__main__", [str(folder / "train.py"), "--lr", "0.1"], 42]


def test_module_mode(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "run.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    proc = boot("-m", "pkg.run", "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "__main__ ['x']"


def test_exit_hook_destroys_a_process_group_left_behind(tmp_path: Path) -> None:
    """A script that never calls destroy_process_group still exits cleanly, and the hook is what frees it."""
    (tmp_path / "leaky.py").write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print('left initialized:', dist.is_initialized())\n"
    )
    proc = boot(str(tmp_path / "leaky.py"), cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "left initialized: True"), proc.stderr
    code = (
        "import torch.distributed as dist\n"
        "from hpc_train.runtime.script_boot import release_distributed\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "release_distributed()\n"
        "print(dist.is_initialized())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
