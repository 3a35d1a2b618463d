"""The local trainer: what every method's local training shares, owned in one place.

An algorithm says what is particular to it: which models its clients train (`optim_slots`), the
gradient of each step's objective (its loss terms, through `grad` / `value_and_grad`, and its
gradient corrections: a proximal term, SCAFFOLD's control variates) and the rate. The trainer owns
the rest:

- **the optimizer** (`optim.*`: SGD, momentum, Nesterov, weight decay, Adam, AdamW, the schedules,
  persist/restart): `descend(local, key, g, lr, rnd)` is one step of it on the model `local[key]`
  (or on some of its entries: FedRep's head and body, each with its own optimizer as PFLlib's
  clients keep two), with that model's optimizer state in `local[slot]`. Plain SGD of a constant
  lr (the default) is `tree.sgd`, the one op every method's step always ran, so its numbers stay as
  they were. The state of every slot starts fresh, or (optim.state=persist) from the client's own
  rows of `ServerState.clients[slot]`, kept there after the round (checkpointed with the run).
- **BatchNorm**: a model in a Local is a model STATE, its parameters with the BatchNorm layers'
  running statistics (`engine.params_of`); `grad` and `value_and_grad` run the forward in training
  mode (each client's batch statistics) and write the updated running statistics back into that
  model's state. A model's statistics go where its parameters go: averaged with them by the
  server (`bn=averaged`, FedAvg's paper; `tree.weighted_mean`), kept per client with a personal
  model; with `bn=local` (`BN_POLICIES`) each client keeps its own statistics of the shared model
  too (PFLlib's clients, whose server moves parameters only), the server's model carrying the first
  aggregated client's.
- **the local-work unit**: `tau` steps, or `local_epochs` passes over each client's own rows
  (`base.Phase`; fedrun.simulate sorts a round's clients by their numbers of steps so that a step
  computes only the clients still training).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import is_buffer, split_buffers
from ..engine.tree import Params, gather, scatter, sgd, stack
from .optim import PLAIN, LocalOptim

Local = dict

# How a shared model's BatchNorm running statistics are kept (`bn=`, docs/baselines.md "BatchNorm").
BN_POLICIES = ("averaged", "local")


def slot_of(key: str) -> str:
    """The Local entry holding the optimizer state of the model `local[key]` ("opt" for "params",
    the name runs written before other models had optimizers used)."""
    return "opt" if key == "params" else f"opt.{key}"


def _where(live: Tensor, new, old):
    return {k: torch.where(live.view(-1, *[1] * (new[k].dim() - 1)), new[k], old[k]) for k in new}


class LocalTrainer:
    """Mixin of `base.Algorithm`: the optimizer, BatchNorm and the slots of optimizer state."""

    optim: LocalOptim = PLAIN
    bn: str = "averaged"

    # -- what an algorithm declares -------------------------------------------------------------

    def optim_slots(self, local: Local) -> dict[str, tuple[str, list[str]]]:
        """slot -> (the Local entry of a model the local steps train with `descend`, the entries of it
        that optimizer updates): every model a client trains, each with its own optimizer state.
        Default: the client's model `params`, all its parameters."""
        return {"opt": ("params", [k for k in local["params"] if not is_buffer(k)])}

    # -- the steps --------------------------------------------------------------------------------

    def grad(self, engine: Engine, local: Local, key: str, x: Tensor, y: Tensor) -> tuple[Params, Tensor, Local]:
        """(gradients of the parameters of the model `local[key]` on the minibatch, per-client losses,
        `local` with that model's BatchNorm statistics updated by the step's forward)."""
        g, loss, buffers = engine.state_grad(local[key], x, y)
        return g, loss, ({**local, key: {**local[key], **buffers}} if buffers else local)

    def value_and_grad(self, engine: Engine, local: Local, key: str, fn: Callable[..., Tensor],
                       *args) -> tuple[Params, Tensor, Local]:
        """`grad` of an objective fn(state, *args) of the model `local[key]` (a loss with the method's
        own terms: MOON's contrastive term, FedProto's prototype distance, ...)."""
        g, value, buffers = engine.state_value_and_grad(fn, local[key], *args)
        return g, value, ({**local, key: {**local[key], **buffers}} if buffers else local)

    def sgd_step(self, engine: Engine, local: Local, batches, lr: float, rnd: int) -> Local:
        """One step of the optimizer (default: plain SGD of lr) of every client's model `local["params"]`
        on its one minibatch of its plain loss (FedAvg's local step; Local's and FedPer's too)."""
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        return self.descend(local, "params", g, lr, rnd)

    def descend(self, local: Local, key: str, g: Params, lr: float, rnd: int, names=None, slot: str | None = None,
                live: Tensor | None = None) -> Local:
        """`local` after one step of the optimizer on the model `local[key]` along `g` (the gradient of
        the step's objective, corrections included) at round `rnd`'s rate for base rate `lr`: every
        parameter of `g` (or the entries `names`), with the optimizer state of `slot` (default
        `slot_of(key)`); `live` [m] bool: the clients that step (the others keep model and state)."""
        w = local[key]
        keys = [k for k in w if k in g and not is_buffer(k)] if names is None else \
            [k for k in w if k in set(names)]
        slot = slot or slot_of(key)
        sub = {k: w[k] for k in keys}
        if self.optim.plain:
            new, state = sgd(sub, {k: g[k] for k in keys}, lr), None
        else:
            state = local.get(slot)
            if state is None:  # (a Local the round loop did not start: an onboarding fit, a test)
                state = self.optim.fresh({k: v[0] for k, v in sub.items()}, len(next(iter(sub.values()))))
            new, new_state = self.optim.step(sub, {k: g[k] for k in keys}, state, self.optim.lr_at(lr, rnd))
            if live is not None and new_state:
                new_state = {k: (_where(live, v, state[k]) if isinstance(v, dict) else
                                 torch.where(live, v, state[k])) for k, v in new_state.items()}
            state = new_state
        if live is not None:
            new = _where(live, new, sub)
        out = {**local, key: {**w, **new}}
        if state:
            out[slot] = state
        return out

    # -- where the shared model's BatchNorm statistics ride (`batchnorm.BatchNormState` keeps them apart)

    def shared_buffers(self, local: Local) -> Params:
        """The round's clients' BatchNorm statistics of the shared model ({} without BatchNorm)."""
        return split_buffers(local["params"])[1] if "params" in local else {}

    def with_shared_buffers(self, local: Local, buffers: Params) -> Local:
        return {**local, "params": {**local["params"], **buffers}}

    def server_with_buffers(self, state, buffers: Params):
        return replace(state, params={**state.params, **buffers})

    # -- the slots' state between rounds ----------------------------------------------------------

    def start_local(self, state, clients: Tensor, rnd: int) -> Local:
        """The round's Local: `client_init`, with the clients' own BatchNorm statistics of the shared
        model (`bn=local`) and every slot's optimizer state (fresh, or the clients' kept rows)."""
        local = self.client_init(state, clients, rnd)
        if self.bn == "local" and "bn_local" in state.clients:
            local = self.with_shared_buffers(local, gather(state.clients["bn_local"], clients))
        if not self.optim.stateful:
            return local
        for slot, (key, names) in self.optim_slots(local).items():
            kept = state.clients.get(slot) if self.optim.state == "persist" else None
            if kept is None:
                opt = self.optim.fresh({k: local[key][k][0] for k in names}, len(clients))
            else:
                opt = {k: gather(v, clients) if isinstance(v, dict) else v[clients] for k, v in kept.items()}
            local = {**local, slot: opt}
        return local

    def end_round(self, before, local: Local, clients: Tensor, selected: Tensor, weights: Tensor | None,
                  num_clients: int):
        """`server_update` of the round's state `before`, with the trained clients' optimizer state of
        every slot kept (optim.state=persist) and (`bn=local`) their BatchNorm statistics of the shared
        model, the server's model carrying the first aggregated client's (PFLlib's server copies its
        first uploaded model, then averages the parameters only)."""
        state = self.server_update(before, local, clients, selected, weights)
        if self.bn == "local":
            buffers = self.shared_buffers(local)
            if buffers:
                full = state.clients.get("bn_local")
                if full is None:  # every client starts from the initial model's statistics
                    full = stack(split_buffers(self.eval_params(before))[1], num_clients)
                first = {k: v[selected[0]] for k, v in buffers.items()}
                state = replace(self.server_with_buffers(state, first),
                                clients={**state.clients, "bn_local": scatter(full, clients, buffers)})
        if not self.optim.stateful or self.optim.state != "persist":
            return state
        kept = dict(state.clients)
        for slot, (key, names) in self.optim_slots(local).items():
            if slot not in local:
                continue
            full = kept.get(slot)
            if full is None:
                full = self.optim.fresh({k: local[key][k][0] for k in names}, num_clients)
            rows = local[slot]
            kept[slot] = {k: scatter(v, clients, rows[k]) if isinstance(v, dict)
                          else v.index_copy(0, clients, rows[k].to(v.dtype)) for k, v in full.items()}
        return replace(state, clients=kept)
