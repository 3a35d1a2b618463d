"""PFL: debiased personalized federated learning (Acar et al. 2021; paper 004, Algs. 1-2), its
FedAvg counterpart P-Avg / Per-FedAvg, and the non-personalized FedDyn and SCAFFOLD.

Every algorithm here runs the same local optimizer (Alg. 2, Update): K = `tau` steps, each on a
support batch D and a query batch D' (one batch without adaptation),

    w <- w - lr_t * ( clip( grad L(w; D, D') + linear term + proximal term ) + weight_decay * w )

with L the adaptation's meta-loss (`adaptation.py`: none | maml | proto), lr_t = lr * lr_decay^(t-1)
in round t, and clip a per-client gradient-norm clip (0/None: off). Per algorithm:

  pavg     no linear or proximal term (FedAvg on the meta-loss). adaptation=proto: P-Avg (Proto);
           adaptation=maml: Per-FedAvg with k-step MAML as in paper 004's experiments.
  pfldyn   R_i(w) = -<w, g_i> + alpha/2 ||w - w^t||^2 (Alg. 2, Regularizer, eq. 3): linear term -g_i,
           proximal alpha (w - w^t). After training g_i <- g_i - alpha (w_i - w^t). Server, Update_1:
               h <- h - alpha/m sum_{i in P_t} (w_i - w^t),   w^{t+1} = mean_{i in P_t} w_i - h / alpha
           (FedDyn's server; m = all clients; h = the mean of all clients' g_i, as the authors'
           code computes it; Alg. 2 writes the sum ambiguously as "sum_i w_i - w^t").
  pflscaf  R_i(w) = <w, g - g_i> (eq. 2): linear term c - c_i. Control variates, SCAFFOLD option II
           (Alg. 2): c_i <- c_i - c + (w^t - w_i) / (K beta), beta the configured `lr` (undecayed,
           as in Alg. 2 and the authors' code, also when lr_decay shrinks the steps' lr).
           Server, Update_2: c <- c + 1/m sum_{i in P_t} (c_i^new - c_i), w^{t+1} = mean w_i.
           A client sends its model AND its control variate: models_per_round = 2.
  feddyn, scaffold   pfldyn / pflscaf without adaptation and without personalized models.

The per-client states g_i / c_i persist for EVERY client in `ServerState.clients` (stacked [C, ...]
on the device, checkpointed with the run); a round gathers the sampled clients' rows and scatters
them back, so unsampled clients keep theirs unchanged ("freeze stale devices", Alg. 1).

What follows the authors' code (github.com/alpemreacar/PFL), checked number by number against
traces of it (tests/test_golden_pfl.py, scripts/golden/record_pfl.py):
  * clipping: their regularizer is part of the loss, so the meta-loss gradient, the linear AND the
    proximal term are clipped together; weight decay (their optimizer's) is added unclipped.
  * weight decay skips parameters the loss does not use (torch.optim.SGD skips parameters without
    a gradient): P-Avg (Proto)'s output layer, which no regularizer touches, is not decayed.
  * MAML: the inner steps during training include weight decay, test-time steps do not and are
    clipped (`adaptation.MAML`).
  * the server averages uniformly (the paper-004 presets set aggregate=uniform).
Two choices of that code differ from the paper and are options, on under protocol=official:
  * eval_model=clients_mean: the model scored ("global") and personalized is the mean of EVERY
    client's latest local model (clients never sampled: the initial model), which is what the
    paper's curves plot; the honest default is the server model w^t (Alg. 1's output). It keeps
    one model per client in `ServerState.clients["last"]`.
  * PAvg(proto_first_step_only=True): their P-Avg (Proto) loop switches the model's Proto mode off
    inside its step loop, so each round's steps after the first embed with the network's outputs.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine import Engine, Params, stack, weighted_mean
from .adaptation import make_adaptation
from .base import (Algorithm, EvalContext, Local, ServerState, check_choice, check_positive, clip_per_client,
                   require_body)
from ..errors import ConfigError

EVAL_MODELS = ("server", "clients_mean")


def expand(params: Params, m: int) -> Params:
    """m views of the same params along a new leading client dimension (no copy)."""
    return {k: v.unsqueeze(0).expand(m, *v.shape) for k, v in params.items()}


def _zeros(params: Params, n: int) -> Params:
    return {k: torch.zeros(n, *v.shape, dtype=v.dtype, device=v.device) for k, v in params.items()}


def _scatter(full: Params, ids: Tensor, rows: Params) -> Params:
    return {k: v.index_copy(0, ids, rows[k].to(v.dtype)) for k, v in full.items()}


# FedDyn and SCAFFOLD: the debiased local training with no adaptation (the MAML options are unused).
NO_ADAPTATION = dict(adaptation="none", inner_lr=0.01, inner_steps=1, first_order=False, test_steps=None)


class MetaSGD(Algorithm):
    """The shared local optimizer on the adaptation's meta-loss; with no correction this is pavg."""

    name = "pavg"

    def __init__(self, lr: float, lr_decay: float, weight_decay: float, clip: float | None, adaptation: str,
                 inner_lr: float, inner_steps: int, first_order: bool, test_steps: int | None,
                 eval_model: str | None, finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.lr_decay", lr_decay)
        check_positive("algo.weight_decay", weight_decay, allow_zero=True)
        check_positive("algo.clip", clip or 0, allow_zero=True)
        check_choice("algo.eval_model", eval_model or "server", EVAL_MODELS)
        self.adapt = make_adaptation(adaptation, inner_lr, inner_steps, first_order, test_steps, weight_decay, clip)
        self.adaptation = adaptation
        self.lr, self.lr_decay, self.weight_decay, self.clip = lr, lr_decay, weight_decay, clip or 0
        self.eval_model = eval_model or "server"
        self.batches_per_step = self.adapt.batches
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        if adaptation == "proto" and (finetune_steps or finetune_epochs):
            raise ConfigError(f"algo.adaptation=proto serves class prototypes, which SGD does not fine-tune; "
                              f"set algo.finetune_steps=0 algo.finetune_epochs=null, or algo.adaptation=maml or none")

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        if self.adaptation == "proto":
            require_body(self.name, params, "with algo.adaptation=proto embeds with the model's last hidden layer",
                         ", or algo.adaptation=maml or none")

    def lr_at(self, rnd: int) -> float:
        return self.lr * self.lr_decay ** (rnd - 1)

    @property
    def step_uses_round(self) -> bool:
        """The local step reads the round number when the learning rate decays over rounds."""
        return self.lr_decay != 1

    def init(self, params: Params, num_clients: int) -> ServerState:
        clients = {"last": stack(params, num_clients)} if self.eval_model == "clients_mean" else {}
        return ServerState(params=params, clients=clients)

    def eval_params(self, state: ServerState) -> Params:
        if self.eval_model == "clients_mean":
            return {k: v.mean(0) for k, v in state.clients["last"].items()}
        return state.params

    def keep_last(self, clients_state: dict, ids: Tensor, w: Params) -> dict:
        """`clients_state` with the sampled clients' new models as their latest (eval_model=clients_mean)."""
        if "last" not in clients_state:
            return clients_state
        return {**clients_state, "last": _scatter(clients_state["last"], ids, w)}

    def linear_term(self, local: Local) -> Params | None:
        """Gradient of the regularizer's linear part."""
        return None

    def proximal_term(self, local: Local) -> Params | None:
        return None

    def logits_embedding(self, local: Local) -> bool:
        """Proto: embed with the network's outputs in this step (see PAvg.proto_first_step_only)."""
        return False

    def client_step(self, engine: Engine, local: Local, batches: list[tuple[Tensor, Tensor]], rnd: int) -> Local:
        w = local["params"]
        logits = self.logits_embedding(local)
        meta_loss = self.adapt.meta_loss(engine, logits=True) if logits else self.adapt.meta_loss(engine)
        g, _ = engine.value_and_grad(meta_loss, w, *[t for b in batches for t in b])
        terms = [t for t in (self.linear_term(local), self.proximal_term(local)) if t is not None]
        for term in terms:
            g = {k: g[k] + term[k] for k in g}
        g = clip_per_client(g, self.clip)
        if self.weight_decay:
            # as torch.optim.SGD, which skips parameters without a gradient: a layer the loss does
            # not use (Proto's output layer when no regularizer touches all parameters) is not decayed
            skip = self.adapt.unused(engine, w, batches[0][0], logits) if not terms else frozenset()
            g = {k: g[k] + self.weight_decay * w[k] if k not in skip else g[k] for k in g}
        lr = self.lr_at(rnd)
        out = {**local, "params": {k: w[k] - lr * g[k] for k in w}}
        if "steps" in local:
            out["steps"] = local["steps"] + 1
        return out

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = {k: v[selected] for k, v in local["params"].items()}
        return ServerState(params=weighted_mean(w, weights), extra=state.extra,
                           clients=self.keep_last(state.clients, clients[selected], w))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        batches = None
        if ctx.personalize_batch and self.adaptation == "maml":
            batches = ctx.train_batch(steps=(self.adapt.test_steps,))
        return self.adapt.personalize(engine, self.eval_params(state), ctx.data.train, batches)


class PAvg(MetaSGD):
    """P-Avg (Proto) / Per-FedAvg (MAML) of paper 004's experiments: FedAvg on the meta-loss.

    `proto_first_step_only` (adaptation=proto) reproduces the authors' P-Avg (Proto) training
    loop, which switches the model's Proto mode off inside its step loop: only each round's first
    local step embeds with the last hidden layer, the later ones with the network's outputs.
    """

    name = "pavg"

    def __init__(self, proto_first_step_only: bool | None, **options):
        check_choice("algo.proto_first_step_only", proto_first_step_only, [True, False, None])
        super().__init__(**options)
        self.proto_first_step_only = bool(proto_first_step_only) and self.adaptation == "proto"

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        if self.proto_first_step_only:
            local["steps"] = torch.zeros(len(clients), 1, device=clients.device)
        return local

    def logits_embedding(self, local: Local) -> bool:
        return self.proto_first_step_only and bool(local["steps"][0] > 0)


class PFLDyn(MetaSGD):
    """PFLDyn (paper 004, Alg. 1 with Alg. 2's PFLDyn Regularizer, g_i update and Update_1)."""

    name = "pfldyn"

    def __init__(self, alpha: float, **options):
        check_positive("algo.alpha", alpha)
        super().__init__(**options)
        self.alpha = alpha

    def init(self, params: Params, num_clients: int) -> ServerState:
        state = super().init(params, num_clients)
        h = {k: torch.zeros_like(v) for k, v in params.items()}
        return ServerState(params=params, extra={"h": h}, clients={**state.clients, "g": _zeros(params, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        return {**local, "start": expand(state.params, len(clients)),
                "g": {k: v[clients] for k, v in state.clients["g"].items()}}

    def linear_term(self, local: Local) -> Params:
        return {k: -v for k, v in local["g"].items()}

    def proximal_term(self, local: Local) -> Params:
        w, w0 = local["params"], local["start"]
        return {k: self.alpha * (w[k] - w0[k]) for k in w}

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = {k: v[selected] for k, v in local["params"].items()}
        delta = {k: w[k] - state.params[k] for k in w}  # w_i - w^t, sampled clients
        g_new = {k: local["g"][k][selected] - self.alpha * delta[k] for k in w}
        m = state.clients["g"][next(iter(w))].shape[0]
        h = {k: state.extra["h"][k] - self.alpha / m * delta[k].sum(0) for k in w}
        avg = weighted_mean(w, weights)
        params = {k: avg[k] - h[k] / self.alpha for k in w}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=params, extra={**state.extra, "h": h},
                           clients={**kept, "g": _scatter(state.clients["g"], ids, g_new)})


class PFLScaf(MetaSGD):
    """PFLScaf (paper 004, Alg. 1 with Alg. 2's PFLScaf Regularizer, g_i update and Update_2)."""

    name = "pflscaf"
    models_per_round = 2

    def init(self, params: Params, num_clients: int) -> ServerState:
        state = super().init(params, num_clients)
        c = {k: torch.zeros_like(v) for k, v in params.items()}
        return ServerState(params=params, extra={"c": c}, clients={**state.clients, "c": _zeros(params, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        m = len(clients)
        first = next(iter(state.params.values()))
        return {**local, "start": expand(state.params, m), "c": expand(state.extra["c"], m),
                "ci": {k: v[clients] for k, v in state.clients["c"].items()},
                "steps": torch.zeros(m, 1, dtype=first.dtype, device=first.device)}

    def linear_term(self, local: Local) -> Params:
        return {k: local["c"][k] - local["ci"][k] for k in local["c"]}

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = {k: v[selected] for k, v in local["params"].items()}
        scale = local["steps"][selected].squeeze(1) * self.lr  # K beta, beta the configured (undecayed) lr
        ci = {k: local["ci"][k][selected] for k in w}
        ci_new = {k: ci[k] - state.extra["c"][k] + (state.params[k] - w[k]) / scale.view(-1, *[1] * (w[k].dim() - 1))
                  for k in w}
        m = state.clients["c"][next(iter(w))].shape[0]
        c = {k: state.extra["c"][k] + (ci_new[k] - ci[k]).sum(0) / m for k in w}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=weighted_mean(w, weights), extra={**state.extra, "c": c},
                           clients={**kept, "c": _scatter(state.clients["c"], ids, ci_new)})


class FedDyn(PFLDyn):
    """FedDyn (Acar et al. 2021a): PFLDyn without adaptation; serves only the global model."""

    name = "feddyn"

    def __init__(self, alpha: float, lr: float, lr_decay: float, weight_decay: float, clip: float | None,
                 eval_model: str | None, finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(alpha=alpha, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, clip=clip,
                         eval_model=eval_model, finetune_steps=finetune_steps, finetune_epochs=finetune_epochs,
                         finetune_lr=finetune_lr, **NO_ADAPTATION)


class Scaffold(PFLScaf):
    """SCAFFOLD (Karimireddy et al. 2020, option II): PFLScaf without adaptation; global model only."""

    name = "scaffold"

    def __init__(self, lr: float, lr_decay: float, weight_decay: float, clip: float | None, eval_model: str | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, clip=clip, eval_model=eval_model,
                         finetune_steps=finetune_steps, finetune_epochs=finetune_epochs, finetune_lr=finetune_lr,
                         **NO_ADAPTATION)
