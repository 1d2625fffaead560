"""Runnable example scripts that the README points to, shipped in the wheel; each runs as ``script.module``:

    python -m hpc_train script.module=hpc_train.examples.ddp_tutorial 'script.args=[--out,/tmp]'

- ``ddp_tutorial``: a plain torchrun-style DDP script that knows nothing of hpc_train;
- ``preemptible_loop``: a hand-written loop that stops with its peers on preemption and resumes;
- ``hf_trainer``: a Hugging Face ``Trainer`` with ``hpc_train.integrations.transformers`` (extra ``transformers``);
- ``lightning_script``: a Lightning ``Trainer`` with ``hpc_train.integrations.lightning`` (extra ``lightning``).

To copy them as a starting point: ``cp -r "$(python -c 'import hpc_train.examples as e; print(e.__path__[0])')" .``
"""
