"""The body/head family's base: algorithms that split the model into a body (the representation:
every layer but the output layer) and a head (the output layer, `engine.tree.head_names`), one part
shared and averaged, the other kept by each client: FedPer (fedper.py: the head personal), LG-FedAvg
(lgfedavg.py: the body personal) and FedRep (fedrep.py: FedPer's split, trained in two phases).
FedBABU (fedbabu.py) freezes the head instead and is a FedAvg.

The family's other members build on `PartSharing` too: FedPAC (fedpac.py), GPFL (gpfl.py) and FedCP
(fedcp.py) keep each client's head and add modules and passes of their own.

The personal part lives in the per-client state's field `part` (stacked over ALL clients, started
from the initial model, checkpointed; unsampled clients keep theirs): a `PartClients` (`Clients`) for
FedPer, LG-FedAvg, FedRep and FedPAC, a NamedTuple of its own with `part` among its fields for a
subclass that keeps more per client (`fedcp.FedCPClients`, `gpfl.GPFLClients`: their `init` builds it
from `initial_part`). A round's clients hold a `PartLocal` (`whole_models` with the optimizer state),
or a subclass's own Local with the field `params` (`fedrep.FedRepLocal`, `fedpac.FedPACLocal`, ...)
built from it. Served models: the server's shared part with each client's personal part (bn=local:
with each client's own running statistics of the shared part, `LocalTrainer.with_own_statistics`). The
`global_*` metrics score the server model, whose personal part stays the initial one.

The local optimizer (`optim.*`) steps the whole model, one optimizer per client as PFLlib's
clientPer / clientLG keep. A BatchNorm model's running statistics go with their layer: in the body,
shared and averaged by FedPer (`bn=local`: each client keeps its own), personal in LG-FedAvg.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, expand, gather, head_names, only, param_names, scatter, stack, weighted_mean
from .base import EvalContext, LocalLR, ServerState
from .checks import require_body
from .personalize import onboarding_batches


class PartClients(NamedTuple):
    part: Params  # every client's personal part (FedPer, FedRep: the head; LG-FedAvg: the body)


class PartLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the shared part with each one's personal part)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PartSharing(LocalLR):
    """`tau` SGD steps of lr `lr` on the whole model; the server averages the shared part, each client
    keeps its `personal_part` (head | body)."""

    personal_part = "head"  # which part each client keeps: head | body
    # the per-client state's type: a NamedTuple with the field `part` (a subclass with more fields builds
    # it in its own `init`)
    Clients = PartClients
    optim_ok = True  # (optim.*: its local step is sgd_step)
    batchnorm_ok = True  # the statistics ride in the model's state, shared or kept as their layer is

    def personal_names(self, params: Params) -> list[str]:
        head = head_names(params)
        return head if self.personal_part == "head" else [k for k in params if k not in head]

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, f"keeps the model's {self.personal_part} per client and shares the rest")

    def initial_part(self, params: Params, num_clients: int) -> Params:
        """Every client's personal part at the start (the initial model's, stacked), `params` checked."""
        self.check_params(params)
        return stack(only(params, self.personal_names(params)), num_clients)

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params, clients=self.Clients(part=self.initial_part(params, num_clients)))

    def whole_models(self, state: ServerState, ids: Tensor) -> Params:
        """The clients `ids`' whole models: the server's shared part with each one's personal part."""
        return {**stack(state.params, len(ids)), **gather(state.clients.part, ids)}

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> PartLocal:
        return PartLocal(params=self.whole_models(state, clients))

    def client_step(self, engine: Engine, local: PartLocal, batches, rnd: int) -> PartLocal:
        return self.sgd_step(engine, local, batches, self.lr, rnd)

    def server_update(self, state: ServerState, local: PartLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        """The shared part averaged (`weights`) over the round's `selected` clients; each round's client
        keeps its trained personal part (the Local's `params`; a subclass's Local has that field too)."""
        mine, p = state.clients.part, local.params
        shared = weighted_mean(gather({k: v for k, v in p.items() if k not in mine}, selected), weights)
        part = scatter(mine, clients, only(p, mine))
        return ServerState(params={**state.params, **shared}, extra=state.extra,
                           clients=state.clients._replace(part=part))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        """Each client's model: the server's shared part with its personal part; bn=local: with its own
        statistics of the shared part (PFLlib scores each client's own model, whose buffers never leave it)."""
        mine = state.clients.part
        C = next(iter(mine.values())).shape[0]
        return self.with_own_statistics(state, {**expand(state.params, C), **mine}), None

    def shared_buffers(self, local: PartLocal) -> Params:  # (trainer, bn=local): the SHARED part's statistics
        p = local.params
        mine = set(self.personal_names(p))
        return {k: v for k, v in split_buffers(p)[1].items() if k not in mine}

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal part, fitted with the shared part frozen: new_client_steps
        (null: tau) steps of the optimizer (a fresh one; default SGD) of lr on minibatches of its
        training rows, from its (initial) part; the forward in training mode (BatchNorm: the part's
        running statistics updated; the shared part's: bn=averaged, from the server's and not kept;
        bn=local, from its own, the initial model's, and kept, as PFLlib's new clients fine-tune in
        train())."""
        part = state.clients.part
        local = PartLocal(params=self.with_own_statistics(state, self.whole_models(state, new), new))
        names = param_names(part)
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _, local = self.grad(engine, local, "params", x, y, wrt=names)  # (the part's gradient only)
            local = self.descend(local, "params", g, self.lr, 0)  # (round 0: the schedule's first rate)
        fitted = scatter(part, new, only(local.params, part))
        return ServerState(params=state.params, extra=state.extra, clients=state.clients._replace(part=fitted),
                           trainer=self.kept_own_statistics(state, new, local.params))
