"""A script's global batch on any rank count (``hpc_train.global_batch``, ``script.global_batch``): the split, the
sampler's order, the check that a script which says it keeps one asks for it, and the config rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.core.errors import ConfigError
from hpc_train.core.rundir import RunDir
from hpc_train.global_batch import GlobalBatch, GlobalBatchSampler
from hpc_train.launch.launcher import write_config
from hpc_train.runtime import preemption
from hpc_train.tools.api import compose_config

preemption._signals.restore()
"""Importing the script-side API installs the stop handlers a script wants; this test process is no script, and
the tests of signals beside these in a worker expect the defaults."""

SCRIPT = ["script.module=hpc_train.examples.global_batch_loop", "cluster=slurm", "cluster.nodes=3"]


def steps_of(samples: int, size: int, ranks: int, step: int = 0, epoch: int | None = None) -> dict[int, list[int]]:
    """Global step -> the samples its ranks take, in rank order, from ``step`` on (one epoch)."""
    taken: dict[int, list[int]] = {}
    for rank in range(ranks):
        sampler = GlobalBatchSampler(samples, size=size, ranks=ranks, rank=rank, seed=3, step=step)
        if epoch is not None:
            sampler.set_epoch(epoch)
        items = list(sampler)
        assert len(items) == len(sampler)
        share = size // ranks
        first = sampler.epoch * sampler.steps_per_epoch + (step % sampler.steps_per_epoch if epoch is None else 0)
        for k in range(0, len(items), share):
            taken.setdefault(first + k // share, []).extend(items[k : k + share])
    return {t: sorted(s) for t, s in taken.items()}


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 6, 12])
def test_every_step_trains_on_the_same_samples_whatever_the_rank_count(ranks: int) -> None:
    """A global batch of 24 over 100 items: 4 whole steps an epoch (4 items left out), the same for any rank count;
    a resume at step 6 (epoch 1, its third step) takes exactly the steps not yet done."""
    one = steps_of(100, 24, 1)
    assert steps_of(100, 24, ranks) == one and len(one) == 4
    assert all(len(s) == len(set(s)) == 24 for s in one.values())
    assert len({i for s in one.values() for i in s}) == 96  # no sample twice in an epoch
    resumed = steps_of(100, 24, ranks, step=6)
    assert sorted(resumed) == [6, 7] and resumed == {t: s for t, s in steps_of(100, 24, 1, epoch=1).items() if t >= 6}


def test_a_new_epoch_is_another_permutation_and_set_epoch_of_the_resumed_one_keeps_its_place() -> None:
    sampler = GlobalBatchSampler(100, size=24, ranks=2, rank=0, seed=3, step=5)
    assert (sampler.epoch, len(sampler)) == (1, 3 * 12)
    sampler.set_epoch(1)  # the loop's own set_epoch of the epoch it resumes in
    assert len(sampler) == 36
    first = list(sampler)
    sampler.set_epoch(2)
    assert len(sampler) == 48 and list(sampler)[:36] != first
    with pytest.raises(ValueError, match="holds no global batch of 24"):
        GlobalBatchSampler(20, size=24, ranks=2, rank=0)


def test_the_split_keeps_the_per_rank_batch_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPC_TRAIN_GLOBAL_BATCH", "48")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    full = GlobalBatch.of(per_rank=16, steps=100)
    assert (full.size, full.ranks, full.rank, full.per_rank, full.accumulate) == (48, 3, 2, 16, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    two = GlobalBatch.of(per_rank=16)  # 24 a rank: 2 micro-batches of 12
    assert (two.per_rank, two.accumulate) == (
        12,
        2,
    ) and two.describe() == "global batch 48 = 12 a rank x 2 ranks x 2 accumulated"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert (GlobalBatch.of(per_rank=16).per_rank, GlobalBatch.of(per_rank=16).accumulate) == (16, 3)
    monkeypatch.setenv("WORLD_SIZE", "5")
    with pytest.raises(ConfigError, match=r"script.global_batch=48 does not split over the 5 ranks"):
        GlobalBatch.of(per_rank=16)
    monkeypatch.delenv("HPC_TRAIN_GLOBAL_BATCH")  # plain torchrun: the script's own batch
    assert GlobalBatch.of(per_rank=8, accumulate=2).size == 80


def test_a_framework_that_fixes_its_per_rank_batch_only_accumulates(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hugging Face and Lightning integrations: their loader's batch is built, so only the accumulation
    may change, and a share it does not divide is refused with the key to change."""
    monkeypatch.setenv("HPC_TRAIN_GLOBAL_BATCH", "48")
    monkeypatch.setenv("WORLD_SIZE", "1")
    one = GlobalBatch.accumulating(16, 1, None, batch_key="per_device_train_batch_size")
    assert (one.per_rank, one.accumulate) == (16, 3)
    monkeypatch.setenv("WORLD_SIZE", "2")  # 24 a rank: 16 does not divide it
    with pytest.raises(ConfigError, match=r"24 samples a rank a step, which per_device_train_batch_size=16 does not"):
        GlobalBatch.accumulating(16, 1, None, batch_key="per_device_train_batch_size")


def test_a_script_that_says_it_keeps_a_global_batch_but_never_asks_ends_at_its_first_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preemption, "_batch_taken", False)
    monkeypatch.setattr(preemption, "_first_step", None)
    monkeypatch.setenv("HPC_TRAIN_GLOBAL_BATCH", "48")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"script.global_batch=48 says .* without asking hpc_train.global_batch"):
        preemption.should_stop(1)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("HPC_TRAIN_RUN_DIR", raising=False)
    GlobalBatch.of(per_rank=16, steps=10)
    assert preemption._steps_total == 10
    assert preemption.should_stop(1) is False


def test_a_node_range_for_a_script_needs_its_global_batch_and_one_that_splits() -> None:
    with pytest.raises(ConfigError, match=r"cluster.min_nodes=2 .* set script.global_batch to its global batch"):
        compose_config(*SCRIPT, "cluster.min_nodes=2")
    cfg = compose_config(*SCRIPT, "cluster.min_nodes=2", "script.global_batch=48")
    assert cfg.script.global_batch == 48
    with pytest.raises(ConfigError, match=r"global batch of 3 nodes .* does not split over 2 ranks"):
        compose_config(*SCRIPT, "cluster.min_nodes=2", "script.global_batch=33")
    with pytest.raises(ConfigError, match=r"script.global_batch=40 does not split over the 3 ranks"):
        compose_config(*SCRIPT, "script.global_batch=40")
    with pytest.raises(ConfigError, match=r"script.global_batch=40 does not split over the 3 ranks"):
        compose_config(*SCRIPT, "script.global_batch=40", "cluster.min_nodes=2")  # not the trainer's batch
    with pytest.raises(ConfigError, match=r"script.global_batch=48 is the global batch of a script of your own"):
        compose_config("cluster=slurm", "script.global_batch=48")


def test_a_scripts_run_dir_resumes_on_another_shape_only_with_its_global_batch(tmp_path: Path) -> None:
    local = ["script.module=hpc_train.examples.global_batch_loop", "cluster=local", "cluster.tasks_per_node=2"]
    kept = RunDir(tmp_path / "kept")
    write_config(compose_config(*local, "script.global_batch=16"), kept, overrides=[])
    write_config(compose_config(*local[:2], "cluster.tasks_per_node=1", "script.global_batch=16"), kept, overrides=[])
    [reshape] = kept.reshape_records()
    assert reshape.was.startswith("1 node x 2 tasks (global batch 16") and reshape.onto.startswith("1 node x 1 task")
    with pytest.raises(ConfigError, match=r"its global batch was script.global_batch=16; this config says 8"):
        write_config(
            compose_config(*local[:2], "cluster.tasks_per_node=2", "script.global_batch=8"), kept, overrides=[]
        )
    own = RunDir(tmp_path / "own")
    write_config(compose_config(*local), own, overrides=[])
    with pytest.raises(ConfigError, match=r"did not keep a global batch \(script.global_batch unset\)"):
        write_config(compose_config(*local[:2], "cluster.tasks_per_node=1"), own, overrides=[])
