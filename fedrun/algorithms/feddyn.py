"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, ICLR 2021): PFLDyn (pfldyn.py) without
adaptation; serves only the global model."""
from __future__ import annotations

from .debiased import NO_ADAPTATION
from .pfldyn import PFLDyn


class FedDyn(PFLDyn):
    """FedDyn (Acar et al. 2021a): PFLDyn without adaptation; serves only the global model."""

    name = "feddyn"
    agreement_options = dict(lr=0.1, lr_decay=0.9, weight_decay=0.01, clip=0.5, alpha=0.01)  # fedrun.bench.agreement

    def __init__(self, alpha: float, lr: float, lr_decay: float, weight_decay: float, clip: float | None,
                 eval_model: str | None, finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(alpha=alpha, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, clip=clip,
                         eval_model=eval_model, finetune_steps=finetune_steps, finetune_epochs=finetune_epochs,
                         finetune_lr=finetune_lr, **NO_ADAPTATION)
