"""Read back what W&B wrote offline, without a server: the history rows of every offline folder of one run id,
through the product's reader of W&B's run files (``hpc_train.tracking.wandb_files``). A chunk cut off or
damaged ends what it reads, so the rows after it are missing and a test that expects them fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpc_train.tracking.wandb_files import offline_folders, offline_records


def offline_history(wandb_dir: Path, run_id: str) -> list[tuple[str, int, dict[str, Any]]]:
    """(offline folder, step, {key: value}) of every history row of ``run_id`` under ``wandb_dir``, in the order
    the folders were made (their names start with the time)."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for folder in offline_folders(wandb_dir, run_id):
        for raw in offline_records(folder / f"run-{run_id}.wandb"):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append((folder.name, record.history.step.num, items))
    return rows


def attempts_that_opened_wandb(run_dir: Path) -> list[Path]:
    """Rank 0's logs (one per attempt) that say the attempt's W&B run started: each such attempt has one offline
    folder. An attempt that ends before its W&B run is up (the import alone takes seconds on busy cores) has none,
    and leaves its rows to the next attempt, which sends them from metrics.jsonl."""
    return [log for log in (run_dir / "logs").glob("rank_0*.log") if "logging to W&B run" in log.read_text()]
