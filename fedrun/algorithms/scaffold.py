"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, option II): PFLScaf
(pflscaf.py) without adaptation; serves only the global model."""
from __future__ import annotations

from .debiased import NO_ADAPTATION
from .pflscaf import PFLScaf


class Scaffold(PFLScaf):
    """SCAFFOLD (Karimireddy et al. 2020, option II): PFLScaf without adaptation; global model only."""

    name = "scaffold"
    agreement_options = dict(lr=0.1, lr_decay=0.9, weight_decay=0.01, clip=0.5)  # fedrun.bench.agreement

    def __init__(self, lr: float, lr_decay: float, weight_decay: float, clip: float | None, eval_model: str | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, clip=clip, eval_model=eval_model,
                         finetune_steps=finetune_steps, finetune_epochs=finetune_epochs, finetune_lr=finetune_lr,
                         **NO_ADAPTATION)
