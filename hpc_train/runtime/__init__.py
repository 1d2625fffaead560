"""The worker side: what runs on every task, around the trainer or the user's own script.

``worker`` is the entry (resolve, init, build, fit, close); each policy it applies lives in its own module:
``startup`` (start-up tuning), ``logs`` (per-rank logging), ``requeue`` (what to do after a stop signal),
``script`` / ``script_boot`` (a user's torchrun-style script), ``faults`` (deliberate failures, for tests).
"""
