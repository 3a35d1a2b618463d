"""The body/head family's base: algorithms that split the model into a body (the representation:
every layer but the output layer) and a head (the output layer, `engine.tree.head_names`), one part
shared and averaged, the other kept by each client: FedPer (fedper.py: the head personal), LG-FedAvg
(lgfedavg.py: the body personal) and FedRep (fedrep.py: FedPer's split, trained in two phases).
FedBABU (fedbabu.py) freezes the head instead and is a FedAvg.

The personal part lives in `ServerState.clients["part"]` (stacked over ALL clients, started from the
initial model, checkpointed; unsampled clients keep theirs). Served models: the server's shared
part with each client's personal part. The `global_*` metrics score the server model, whose
personal part stays the initial one.

The local optimizer (`optim.*`) steps the whole model, one optimizer per client as PFLlib's
clientPer / clientLG keep. A BatchNorm model's running statistics go with their layer: in the body,
shared and averaged by FedPer (`bn=local`: each client keeps its own), personal in LG-FedAvg.
"""
from __future__ import annotations

from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, expand, gather, head_names, only, param_names, scatter, stack, weighted_mean
from .base import EvalContext, Local, LocalLR, ServerState
from .checks import require_body
from .personalize import onboarding_batches


class PartSharing(LocalLR):
    """`tau` SGD steps of lr `lr` on the whole model; the server averages the shared part, each client
    keeps its `personal_part` (head | body)."""

    personal_part = "head"  # which part each client keeps: head | body
    optim_ok = True  # (optim.*: its local step is sgd_step)
    batchnorm_ok = True  # the statistics ride in the model's state, shared or kept as their layer is

    def personal_names(self, params: Params) -> list[str]:
        head = head_names(params)
        return head if self.personal_part == "head" else [k for k in params if k not in head]

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, f"keeps the model's {self.personal_part} per client and shares the rest")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        mine = {k: params[k] for k in self.personal_names(params)}
        return ServerState(params=params, clients={"part": stack(mine, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        p = stack(state.params, len(clients))
        return {"params": {**p, **gather(state.clients["part"], clients)}}

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        return self.sgd_step(engine, local, batches, self.lr, rnd)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        mine = state.clients["part"]
        shared = weighted_mean(gather({k: v for k, v in local["params"].items() if k not in mine}, selected), weights)
        part = scatter(mine, clients, {k: local["params"][k] for k in mine})
        return ServerState(params={**state.params, **shared}, extra=state.extra,
                           clients={**state.clients, "part": part})

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = state.clients["part"]
        C = next(iter(mine.values())).shape[0]
        return {k: mine[k] if k in mine else v for k, v in expand(state.params, C).items()}, None

    def shared_buffers(self, local: Local) -> Params:  # (trainer, bn=local): the SHARED part's statistics
        mine = set(self.personal_names(local["params"]))
        return {k: v for k, v in split_buffers(local["params"])[1].items() if k not in mine}

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal part, fitted with the shared part frozen: new_client_steps
        (null: tau) steps of the optimizer (a fresh one; default SGD) of lr on minibatches of its
        training rows, from its (initial) part; the forward in training mode (BatchNorm: the part's
        running statistics updated; the shared part's are not kept)."""
        part = state.clients["part"]
        local = {"params": {**stack(state.params, len(new)), **gather(part, new)}}
        names = param_names(part)
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _, local = self.grad(engine, local, "params", x, y)
            local = self.descend(local, "params", only(g, names), self.lr, 0)  # (round 0: the schedule's first rate)
        p = local["params"]
        return ServerState(params=state.params, extra=state.extra,
                           clients={**state.clients, "part": scatter(part, new, {k: p[k] for k in part})})
