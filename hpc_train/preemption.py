"""``from hpc_train import preemption``: the path scripts import, kept as an alias of ``hpc_train.runtime.preemption``."""

from hpc_train.runtime.preemption import restart_count, should_stop, stop_signal, tracker_run_ids

__all__ = ["restart_count", "should_stop", "stop_signal", "tracker_run_ids"]
