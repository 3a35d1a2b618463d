"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Alg. 1): each round, the first
`head_steps` local steps train the client's HEAD only (body frozen), the remaining `tau - head_steps`
steps train the BODY only (head frozen), both with lr `lr`; the server averages the body; each
client keeps its head (`bodyhead.PartSharing`). (The paper counts these in epochs, 10 for the head
and 1 for the body; here they are steps of the round's tau.)

A step computes every parameter's gradient from one backward pass and masks the update of the part
the phase freezes (a per-client step counter in the round's state, compared on the device; no host
synchronization). The frozen part's update is multiplied by 0, so it stays bit-exact.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import head_names, per_client
from .base import Local, ServerState
from .bodyhead import PartSharing
from .checks import check_int


class FedRep(PartSharing):
    name = "fedrep"
    personal_part = "head"
    agreement_options = dict(lr=0.1, head_steps=1)  # fedrun.bench.agreement: both phases in tau=2

    def __init__(self, lr: float, head_steps: int, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_int("algo.head_steps", head_steps, 0)
        self.head_steps = head_steps

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        return {**local, "step": torch.zeros(len(clients), 1, dtype=torch.long, device=clients.device)}

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        (x, y), = batches
        p, step = local["params"], local["step"]
        g, _ = engine.grad(p, x, y)
        head = set(head_names(p))
        on_head = step < self.head_steps  # [m, 1]: this step trains the head (else the body)
        new = {}
        for k in p:
            mask = per_client(on_head if k in head else ~on_head, p[k])
            new[k] = p[k] - self.lr * mask * g[k]
        return {"params": new, "step": step + 1}
