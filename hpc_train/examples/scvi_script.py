"""scvi-tools' SCVI on every rank hpc_train starts, preemption-safe and exactly resumable (the README's example).

    python -m hpc_train script.module=hpc_train.examples.scvi_script 'script.args=[--out,DIR]'

The lines an scvi-tools user adds are marked "hpc_train:". A small synthetic count matrix (the same on every
rank) stands in for your AnnData. On rank 0 it writes the trained weights (``final.pt``) and ``model.history``
(``history.json``); ``step.txt`` and ``starts.txt`` tell tests where the run is, and ``--signal-at`` makes the
first attempt send itself the preemption signal at a given step.
"""

import argparse
import json
import os

import anndata
import numpy as np
import scvi
import torch

from hpc_train.examples.lightning_script import Progress  # test instrumentation, shared with that example
from hpc_train.integrations.lightning import PreemptionCallback, last_checkpoint, trainer_shape


def counts(cells: int, genes: int) -> anndata.AnnData:
    """Poisson counts of two kinds of cells, from a fixed seed: the same data on every rank."""
    rng = np.random.default_rng(0)
    rates = rng.gamma(2.0, 1.0, size=(2, genes))
    kind = rng.integers(0, 2, size=cells)
    return anndata.AnnData(rng.poisson(rates[kind]).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--cells", type=int, default=640)
    parser.add_argument("--signal-at", type=int, default=-1, help="the first attempt signals itself at this step")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    scvi.settings.seed = 0
    adata = counts(args.cells, 60)
    scvi.model.SCVI.setup_anndata(adata)
    model = scvi.model.SCVI(adata, n_hidden=32, n_latent=4)
    model.train(
        max_epochs=args.epochs,
        batch_size=32,
        accelerator="cpu",
        **trainer_shape(),  # hpc_train: devices and num_nodes = the ranks hpc_train started
        strategy="ddp_find_unused_parameters_true",  # hpc_train: DDP over them (bit-identical resume)
        callbacks=[PreemptionCallback(), Progress(args.out, 0.0, [args.signal_at])],  # hpc_train: stop, save, requeue
        default_root_dir=args.out,  # hpc_train: this run's own folder for the hpc_ckpt_<step>.ckpt files
        log_save_dir=args.out,  # hpc_train: and for scvi's history.pkl, which other ranks read (default: ./)
        ckpt_path=last_checkpoint(args.out),  # hpc_train: resume from the newest (None on the first attempt)
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
        history = {name: frame.iloc[:, 0].astype(float).tolist() for name, frame in model.history.items()}
        with open(os.path.join(args.out, "history.json"), "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    main()
