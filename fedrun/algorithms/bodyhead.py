"""The body/head family's base: algorithms that split the model into a body (the representation:
every layer but the output layer) and a head (the output layer, `engine.tree.head_names`), one part
shared and averaged, the other kept by each client: FedPer (fedper.py: the head personal), LG-FedAvg
(lgfedavg.py: the body personal) and FedRep (fedrep.py: FedPer's split, trained in two phases).
FedBABU (fedbabu.py) freezes the head instead and is a FedAvg.

The personal part lives in the per-client state's `part` (stacked over ALL clients, started from the
initial model, checkpointed; unsampled clients keep theirs): a `PartClients` for FedPer, LG-FedAvg
and FedRep (`Clients`), whose rounds' clients hold a `PartLocal` (FedRep: a `fedrep.FedRepLocal`);
a dict {"part": ...} and dict Locals for the subclasses that add entries of their own to them (GPFL,
FedCP, FedPAC). Served models: the server's shared part with each client's personal part. The
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
from .base import EvalContext, Local, LocalLR, ServerState
from .checks import require_body
from .personalize import onboarding_batches
from .trainer import get, put


class PartClients(NamedTuple):
    part: Params  # every client's personal part (FedPer, FedRep: the head; LG-FedAvg: the body)


class PartLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the shared part with each one's personal part)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PartSharing(LocalLR):
    """`tau` SGD steps of lr `lr` on the whole model; the server averages the shared part, each client
    keeps its `personal_part` (head | body)."""

    personal_part = "head"  # which part each client keeps: head | body
    # the per-client state's type: PartClients (FedPer, LG-FedAvg, FedRep: their Locals typed too,
    # `part_local`); None, a dict {"part": ...} with dict Locals, which GPFL, FedCP and FedPAC add to
    Clients = None
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
        return ServerState(params=params, clients=(self.Clients or dict)(part=self.initial_part(params, num_clients)))

    def part_local(self, params: Params) -> Local:
        """The round's Local of the clients' whole models `params`: a PartLocal where `Clients` is typed,
        else a dict."""
        return {"params": params} if self.Clients is None else PartLocal(params=params)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        return self.part_local({**stack(state.params, len(clients)), **gather(get(state.clients, "part"), clients)})

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        return self.sgd_step(engine, local, batches, self.lr, rnd)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        mine, p = get(state.clients, "part"), get(local, "params")
        shared = weighted_mean(gather({k: v for k, v in p.items() if k not in mine}, selected), weights)
        part = scatter(mine, clients, only(p, mine))
        return ServerState(params={**state.params, **shared}, extra=state.extra, clients=put(state.clients, part=part))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = get(state.clients, "part")
        C = next(iter(mine.values())).shape[0]
        return {**expand(state.params, C), **mine}, None

    def shared_buffers(self, local: Local) -> Params:  # (trainer, bn=local): the SHARED part's statistics
        p = get(local, "params")
        mine = set(self.personal_names(p))
        return {k: v for k, v in split_buffers(p)[1].items() if k not in mine}

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal part, fitted with the shared part frozen: new_client_steps
        (null: tau) steps of the optimizer (a fresh one; default SGD) of lr on minibatches of its
        training rows, from its (initial) part; the forward in training mode (BatchNorm: the part's
        running statistics updated; the shared part's are not kept)."""
        part = get(state.clients, "part")
        local = self.part_local({**stack(state.params, len(new)), **gather(part, new)})
        names = param_names(part)
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _, local = self.grad(engine, local, "params", x, y)
            local = self.descend(local, "params", only(g, names), self.lr, 0)  # (round 0: the schedule's first rate)
        fitted = scatter(part, new, only(get(local, "params"), part))
        return ServerState(params=state.params, extra=state.extra, clients=put(state.clients, part=fitted))
