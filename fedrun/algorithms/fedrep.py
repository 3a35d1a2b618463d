"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Alg. 1): each round, the first
`head_steps` local steps train the client's HEAD only (body frozen), the remaining `tau - head_steps`
steps train the BODY only (head frozen), both with lr `lr`; the server averages the body; each
client keeps its head (`bodyhead.PartSharing`). These are steps of the round's tau (the default).

With `local_epochs` set, the round counts in epochs of each client's own rows, as the paper (10 head
epochs, 1 body epoch) and PFLlib's clientRep (plocal_epochs head epochs, then local_epochs body
epochs; both 1 by default) do: `head_epochs` passes training the head, then `local_epochs` passes
training the body (`base.Phase`; tau is not used).

A step of the tau path computes every parameter's gradient from one backward pass and masks the update of
the part the phase freezes (a per-client step counter in the round's state, compared on the device; no host
synchronization). The frozen part's update is multiplied by 0, so it stays bit-exact. (The counter is on the
device, so the step cannot choose which part to differentiate without reading it on the host.) In epochs, the
head phase differentiates the head alone (`LocalTrainer.grad`'s `wrt`): the frozen body, upstream of it, is a
constant, with no backward pass through it; the same numbers as the full gradient's update of the head.

The local optimizer (`optim.*`): the head and the body each have their own (slots "opt.head" and
"opt"), as PFLlib's clientRep keeps `poptimizer` for the head and `optimizer` for the body; a step
moves only the part its phase trains and only that part's optimizer state. BatchNorm: every step's
forward runs in training mode (the frozen part's running statistics are updated too, as a torch
model in `train()` with requires_grad off), the body's statistics are averaged with it (`bn=local`:
kept by each client).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, head_names, param_names, per_client
from .base import Phase, ServerState
from .bodyhead import PartSharing
from .checks import check_int, check_optional_int, check_phase_passes, check_split_round


class FedRepLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the shared body with each one's head)
    step: Tensor  # [m, 1] long: the local steps each client has taken this round (the tau path's phase)
    opt: dict = {}  # the local trainer's optimizer state, by slot: "opt" (the body's), "opt.head"


class FedRep(PartSharing):
    name = "fedrep"
    personal_part = "head"
    optim_ok = True  # two optimizers: the head's and the body's (PFLlib's poptimizer, optimizer)
    batchnorm_ok = True
    agreement_options = dict(lr=0.1, head_steps=1)  # fedrun.bench.agreement: both phases in tau=2

    def __init__(self, lr: float, head_steps: int, local_epochs: int | None, head_epochs: int,
                 new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_int("algo.head_steps", head_steps, 0)
        check_optional_int("algo.local_epochs", local_epochs)
        check_int("algo.head_epochs", head_epochs, 0)
        check_phase_passes(self.name, "algo.head_epochs", head_epochs, local_epochs, "head")
        self.head_steps, self.local_epochs, self.head_epochs = head_steps, local_epochs, head_epochs

    def check_tau(self, tau: int) -> None:
        check_split_round(self.name, self.head_steps, tau, self.local_epochs)

    def phases(self) -> tuple[Phase, ...] | None:
        if self.local_epochs is None:
            return None
        return Phase(self.head_step, epochs=self.head_epochs), Phase(self.body_step, epochs=self.local_epochs)

    def optim_slots(self, local: FedRepLocal) -> dict:
        head = head_names(local.params)
        return {"opt": ("params", [k for k in param_names(local.params) if k not in head]),
                "opt.head": ("params", head)}

    def head_step(self, engine: Engine, local: FedRepLocal, batches, rnd: int) -> FedRepLocal:
        return self._part_step(engine, local, batches, rnd, head=True)

    def body_step(self, engine: Engine, local: FedRepLocal, batches, rnd: int) -> FedRepLocal:
        return self._part_step(engine, local, batches, rnd, head=False)

    def _part_step(self, engine: Engine, local: FedRepLocal, batches, rnd: int, head: bool) -> FedRepLocal:
        """One step of the head's (or the body's) optimizer of lr, the other part frozen."""
        (x, y), = batches
        slot = "opt.head" if head else "opt"
        names = self.optim_slots(local)[slot][1]
        # the head phase: the head's gradient only (the body upstream of it, frozen: no backward through it)
        g, _, local = self.grad(engine, local, "params", x, y, wrt=names if head else None)
        return self.descend(local, "params", g, self.lr, rnd, names=names, slot=slot)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedRepLocal:
        local = super().client_init(state, clients, rnd)
        return FedRepLocal(params=local.params,
                           step=torch.zeros(len(clients), 1, dtype=torch.long, device=clients.device))

    def client_step(self, engine: Engine, local: FedRepLocal, batches, rnd: int) -> FedRepLocal:
        (x, y), = batches
        step = local.step
        g, _, local = self.grad(engine, local, "params", x, y)
        p = local.params
        on_head = step < self.head_steps  # [m, 1]: this step trains the head (else the body)
        if self.optim.plain:
            head = set(head_names(p))
            new = {}
            for k in g:
                mask = per_client(on_head if k in head else ~on_head, p[k])
                new[k] = p[k] - self.lr * mask * g[k]
            return local._replace(params={**p, **new}, step=step + 1)
        slots = self.optim_slots(local)
        for slot, live in (("opt.head", on_head[:, 0]), ("opt", ~on_head[:, 0])):
            local = self.descend(local, "params", g, self.lr, rnd, names=slots[slot][1], slot=slot, live=live)
        return local._replace(step=step + 1)
