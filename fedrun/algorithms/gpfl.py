"""GPFL (Zhang, Hua, Wang, Cao, Guan, Wang, ICCV 2023): global and personalized feature learning.

Two trainable modules beside the model, both global (averaged by the server like the body):
  CoV (conditional valve): gamma(c) = LN(ReLU(W_g c + b_g)), beta(c) = LN(ReLU(W_b c + b_b)), and
      CoV(f, c) = ReLU(f * (gamma(c) + 1) + beta(c)) for features f [B, d] and a condition c [d];
  GCE (global category embedding): one embedding e_k [d] per class; its loss on features f is the
      cross-entropy of the cosine similarities cos(f, e_k) (no scale).
Each client has two conditions: the generic one g = mean_k e_k and its personalized one
p_i = sum_k share_ik e_k (share_ik: class k's share of its training rows). A local step on one
minibatch minimizes, over the model (body and the client's head), the CoV and the client's copy of
the GCE,

    CE(head(CoV(f, p_i)), y) + GCE-loss(CoV(f, g), y) + lam ||CoV(f, g) - E0[y]||_F

(f the body's features, E0 the round's received embeddings, frozen; the Frobenius norm of the whole
batch's difference, not squared, as PFLlib); the CoV and the GCE take SGD with weight decay `mu`.
The server averages (`weights`) the body, the CoV and the GCE; each client keeps its head,
`GPFLClients.part`. Served: head_i(CoV(body(x), p_i)). A round's clients hold a `GPFLLocal`.

A round is `tau` steps, the class shares those of the round's minibatches so far; with
`local_epochs` set, as PFLlib's: a pass over the client's rows counting its classes (no training),
then `local_epochs` passes of the step above (`base.Phase`; tau is not used).

follow=pfllib (protocol=official) takes the conditions as PFLlib's clientGPFL does: computed in
`set_GCE` from the client's OWN GCE just before it is replaced by the new global one, i.e. from the
GCE it trained this round (selected clients) or from the previous global one (the others), and zero
before the first; `GPFLClients.emb` [C, K, d] holds the embeddings each client's next conditions come
from. follow=paper: from the received global GCE.

BatchNorm models (PFLlib's clientGPFL): a step's one forward of the body runs in train mode (batch
statistics, the running ones updated; the trainer's `value_and_grad`); the body's statistics go with
the body: averaged by the server (bn=averaged), or kept by each client (bn=local: PFLlib's server
moves parameters only), the server's model carrying the first aggregated client's. Served models
carry the server's statistics (bn=averaged) or each client's own (bn=local); a held-out client's
head fit runs in train mode from its served statistics and, with bn=local, keeps the fit's.

The CoV's and GCE's initial parameters are drawn as PyTorch initializes nn.Linear / nn.Embedding,
from a generator seeded by the model's initial parameters (so a run's seed sets them, batched seeds
too).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from ..data.federated import ClientSplit
from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import (
    Params,
    axpy,
    expand,
    gather,
    head_names,
    only,
    param_names,
    scale,
    scatter,
    stack,
    sub,
    weighted_mean,
)
from .base import EvalContext, Phase, ServerState
from .bodyhead import PartLocal, PartSharing
from .checks import check_choice, check_optional_int, check_positive
from .personalize import onboarding_batches
from .trainer import slot_of


class JointLocal(NamedTuple):
    """The models one step of GPFL or FedCP trains jointly (with its frozen inputs), as one tree `q` of
    prefixed names (`tagged`): what the local trainer's `value_and_grad` differentiates."""
    q: Params


def tagged(tree: Params, prefix: str) -> Params:
    """`tree` with its names prefixed (`prefix` + name), to join it with other models in one tree."""
    return {f"{prefix}{k}": v for k, v in tree.items()}


def untagged(tree: Params, prefix: str) -> Params:
    """The entries of `tree` named `prefix` + name, by name (`tagged`'s inverse)."""
    n = len(prefix)
    return {k[n:]: v for k, v in tree.items() if k.startswith(prefix)}


class GPFLClients(NamedTuple):
    part: Params  # every client's head (`bodyhead.PartSharing`)
    emb: Tensor | dict = {}  # follow=pfllib: [C, K, d] the embeddings of its next conditions ({} under follow=paper)


class GPFLLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the received body with each one's head)
    cov: Params  # the CoV each client trains
    gce: Params  # {"e": [m, K, d]}: the GCE's embeddings each client trains (a tree: its optimizer slot's)
    frozen: Tensor  # [m, K, d] the round's received embeddings E0 (the alignment's targets)
    emb: Tensor  # [m, K, d] the embeddings its conditions come from
    counts: Tensor  # [m, K] its class counts so far
    opt: dict = {}  # the local trainer's optimizer state, by slot: "opt" (the model's), "opt.cov", "opt.gce"


COV_KEYS = ("gamma.weight", "gamma.bias", "gamma.ln.weight", "gamma.ln.bias",
            "beta.weight", "beta.bias", "beta.ln.weight", "beta.ln.bias")


class GPFL(PartSharing):
    name = "gpfl"
    personal_part = "head"
    # PFLlib's clientGPFL steps three SGD optimizers together, the model's (lr) and the CoV's and GCE's (lr,
    # weight decay mu): optim.* applies to each, three slots ("opt", "opt.cov", "opt.gce")
    optim_ok = True
    # BatchNorm (module docstring): each step's one forward of the body in train mode, statistics with the body
    batchnorm_ok = True

    def check_run(self, run) -> None:
        super().check_run(run)
        optim = run.optim
        if self.mu and optim.weight_decay:
            from ..errors import ConfigError
            raise ConfigError(f"algo.mu={self.mu} is the CoV's and GCE's weight decay (PFLlib's CoV_opt, GCE_opt); "
                              f"with optim.weight_decay={optim.weight_decay} two decays: set one to 0")

    def optim_slots(self, local: GPFLLocal) -> dict:
        return {**super().optim_slots(local), slot_of("cov"): ("cov", list(local.cov)), slot_of("gce"): ("gce", ["e"])}
    models_per_round = 1
    Clients = GPFLClients
    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}
    agreement_options = dict(lr=0.05, lam=0.1, mu=0.1)

    def __init__(self, lr: float, lam: float, mu: float, local_epochs: int | None, follow: str | None,
                 new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_positive("algo.lam", lam, allow_zero=True)
        check_positive("algo.mu", mu, allow_zero=True)
        check_optional_int("algo.local_epochs", local_epochs, 1)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        self.lam, self.mu, self.local_epochs, self.follow = lam, mu, local_epochs, follow or "paper"

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        from ..errors import ConfigError
        if len(head_names(params)) != 2:
            raise ConfigError(f"algo={self.name} needs a model whose output layer is one linear layer "
                              f"(weight and bias)")

    # -- state ------------------------------------------------------------------------------------
    def init_modules(self, params: Params) -> dict:
        """The CoV's and GCE's initial parameters (PyTorch's nn.Linear / nn.Embedding / nn.LayerNorm
        initialization), drawn from a generator seeded by the model's initial parameters."""
        w = params[head_names(params)[0]]
        K, d = w.shape
        first = next(iter(params.values()))
        seed = int(first.double().flatten()[:64].mul(1e6).round().abs().sum().item()) % (2 ** 62)
        g = torch.Generator().manual_seed(seed)
        bound = 1 / math.sqrt(d)
        u = lambda *shape: ((torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound)
        cov = {}
        for part in ("gamma", "beta"):
            cov[f"{part}.weight"], cov[f"{part}.bias"] = u(d, d), u(d)  # kaiming_uniform(a=sqrt 5) = U(+-1/sqrt d)
            cov[f"{part}.ln.weight"], cov[f"{part}.ln.bias"] = (torch.ones(d, dtype=torch.float64),
                                                                torch.zeros(d, dtype=torch.float64))
        gce = torch.randn(K, d, generator=g, dtype=torch.float64)
        cast = lambda t: t.to(dtype=w.dtype, device=w.device)
        return {"cov": {k: cast(v) for k, v in cov.items()}, "gce": cast(gce)}

    def init(self, params: Params, num_clients: int) -> ServerState:
        clients = GPFLClients(part=self.initial_part(params, num_clients))
        extra = self.init_modules(params)
        if self.follow == "pfllib":  # the embeddings of each client's next conditions (none yet: zero)
            clients = clients._replace(emb=torch.zeros(num_clients, *extra["gce"].shape, dtype=extra["gce"].dtype,
                                                       device=extra["gce"].device))
        return ServerState(params=params, extra=extra, clients=clients)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> GPFLLocal:
        local = super().client_init(state, clients, rnd)
        m = len(clients)
        E = state.extra["gce"]
        emb = gather({"e": state.clients.emb}, clients)["e"] if self.follow == "pfllib" else expand({"e": E}, m)["e"]
        return GPFLLocal(params=local.params, cov=stack(state.extra["cov"], m), gce=stack({"e": E}, m),
                         frozen=expand({"e": E}, m)["e"], emb=emb,
                         counts=torch.zeros(m, E.shape[0], dtype=E.dtype, device=E.device))

    # -- the round --------------------------------------------------------------------------------
    def phases(self) -> tuple[Phase, ...] | None:
        if self.local_epochs is None:
            return None
        return Phase(self.count_step, epochs=1), Phase(self.train_step, epochs=self.local_epochs)

    def client_step(self, engine: Engine, local: GPFLLocal, batches, rnd: int) -> GPFLLocal:
        """The round in `tau` steps (local_epochs null): the class shares are those of the labels of
        the round's minibatches so far (this one included), a minibatch estimate of the count pass."""
        return self.train_step(engine, self.count_step(engine, local, batches, rnd), batches, rnd)

    def count_step(self, engine: Engine, local: GPFLLocal, batches, rnd: int) -> GPFLLocal:
        (_, y), = batches
        K = local.counts.shape[1]
        onehot = (y.unsqueeze(-1) == torch.arange(K, device=y.device)).to(local.counts.dtype)
        return local._replace(counts=local.counts + onehot.sum(1))

    def train_step(self, engine: Engine, local: GPFLLocal, batches, rnd: int) -> GPFLLocal:
        (x, y), = batches
        cond_g, cond_p = conditions(local.emb, local.counts)
        head = head_names(local.params)
        lam = self.lam
        q = {**tagged(local.params, "m."), **tagged(local.cov, "cov."), "gce": local.gce["e"]}

        def loss(q: Params, x: Tensor, y: Tensor, frozen: Tensor, cg: Tensor, cp: Tensor) -> Tensor:
            model, cov = untagged(q, "m."), untagged(q, "cov.")
            feat = engine.features(model, x)
            out = F.linear(cov_forward(cov, feat, cp), model[head[0]], model[head[1]])
            feat_g = cov_forward(cov, feat, cg)
            return F.cross_entropy(out, y) + gce_loss(q["gce"], feat_g, y) + lam * torch.linalg.norm(feat_g - frozen[y])

        # (one forward of the body in train mode: a BatchNorm model's running statistics, "m.*", updated)
        g, _, out = self.value_and_grad(engine, JointLocal(q), "q", loss, x, y, local.frozen, cond_g, cond_p)
        state = untagged(out.q, "m.")
        local = local._replace(params=state)
        lr, mu = self.lr, self.mu
        gm = only(untagged(g, "m."), param_names(state))
        gcov = axpy(mu, local.cov, untagged(g, "cov."))  # the CoV's and the GCE's weight decay mu
        ggce = axpy(mu, local.gce, {"e": g["gce"]})
        if self.optim.plain:  # (the arithmetic the golden traces pin)
            return local._replace(params={**state, **sub(only(state, gm), scale(gm, lr))},
                                  cov=sub(local.cov, scale(gcov, lr)), gce=sub(local.gce, scale(ggce, lr)))
        local = self.descend(local, "params", gm, lr, rnd)
        local = self.descend(local, "cov", gcov, lr, rnd)
        return self.descend(local, "gce", ggce, lr, rnd)

    # -- the server -------------------------------------------------------------------------------
    def server_update(self, state: ServerState, local: GPFLLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = super().server_update(state, local, clients, selected, weights)
        cov = weighted_mean(gather(local.cov, selected), weights)
        gce = weighted_mean(gather(local.gce, selected), weights)["e"]
        kept = new.clients
        if self.follow == "pfllib":  # set_GCE: each client's next conditions from the GCE it holds now
            held = state.extra["gce"].expand_as(state.clients.emb)  # the others: last round's global GCE
            kept = kept._replace(emb=held.index_copy(0, clients, local.gce["e"]))
        return ServerState(params=new.params, extra={**state.extra, "cov": cov, "gce": gce}, clients=kept)

    # -- serving ----------------------------------------------------------------------------------
    def _conditions_of(self, state: ServerState, data) -> tuple[Tensor, Tensor]:
        """Every client's (generic, personalized) conditions [C, d] as served, from its class counts."""
        split = data.train
        K = state.extra["gce"].shape[0]
        owner = torch.repeat_interleave(torch.arange(split.num_clients, device=split.y.device),
                                        split.sizes.to(split.y.device),
                                        output_size=len(split.y))  # (known: no read of the sizes' sum)
        counts = torch.zeros(split.num_clients, K, dtype=state.extra["gce"].dtype, device=split.y.device)
        counts.index_put_((owner, split.y), torch.ones_like(split.y, dtype=counts.dtype), accumulate=True)
        emb = (state.clients.emb if self.follow == "pfllib"
               else state.extra["gce"].expand(split.num_clients, *state.extra["gce"].shape))
        return conditions(emb, counts)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        """Per-client tensors [C, ...]: each client's model (the global body, its head), the CoV (the
        global one, expanded) as `cov.<name>`, and its personalized condition as `cond`."""
        models, _ = super().personalize(engine, state, ctx)
        _, cond_p = self._conditions_of(state, ctx.data)
        C = len(cond_p)
        return {**models, **{f"cov.{k}": v for k, v in expand(state.extra["cov"], C).items()}, "cond": cond_p}, None

    def score(self, engine: Engine, served, split: ClientSplit) -> tuple[Tensor, Tensor]:
        params = {k: v for k, v in served.items() if not k.startswith("cov.") and k != "cond"}
        cov = {k[4:]: v[0] for k, v in served.items() if k.startswith("cov.")}
        head = head_names(params)

        def fn(p: Params, cov: Params, cond: Tensor, x: Tensor, y: Tensor, mask: Tensor):
            out = F.linear(cov_forward(cov, engine.features(p, x), cond), p[head[0]], p[head[1]])
            loss = (F.cross_entropy(out, y, reduction="none") * mask).sum()
            return loss, ((out.argmax(-1) == y).to(mask.dtype) * mask).sum()

        return per_client_pass(engine, fn, params, cov, served["cond"], split)

    def set_finetuning(self, steps: int, epochs: int | None, lr: float | None) -> None:
        super().set_finetuning(steps, epochs, lr)
        if steps or epochs:
            from ..errors import ConfigError
            raise ConfigError("algo=gpfl serves its models through its CoV, which the generic fine-tuning does not "
                              "train: set algo.finetune_steps=0 and algo.finetune_epochs=null")

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client: it receives the global GCE (its conditions from it), then fits its head
        with the body and the CoV frozen: new_client_steps (null: tau) SGD steps of lr on the served
        model's cross-entropy over minibatches of its training rows. A BatchNorm model's forward runs
        in train mode (batch statistics, the running ones updated), from the client's served statistics;
        bn=local: they are the client's own after the fit (PFLlib's new clients fine-tune in train()),
        bn=averaged: the server's stay the served ones."""
        clients = state.clients
        if self.follow == "pfllib":
            E = state.extra["gce"]
            clients = clients._replace(emb=clients.emb.index_copy(0, new, E.expand(len(new), *E.shape)))
        state = ServerState(params=state.params, extra=state.extra, clients=clients, trainer=state.trainer)
        _, cond_p = self._conditions_of(state, ctx.data)
        m = len(new)
        part = clients.part
        body = {k: v for k, v in stack(state.params, m).items() if k not in part}
        cov = stack(state.extra["cov"], m)
        heads = gather(part, new)
        hw, hb = head_names(state.params)

        def loss(h: Params, body: Params, cov: Params, cond: Tensor, x: Tensor, y: Tensor) -> Tensor:
            feat = engine.features({**body, **h}, x)
            return F.cross_entropy(F.linear(cov_forward(cov, feat, cond), h[hw], h[hb]), y)

        if split_buffers(body)[1]:
            return self._onboard_batchnorm(engine, state, ctx, new, body, heads, cov, cond_p[new])
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _ = engine.value_and_grad(loss, heads, body, cov, cond_p[new], x, y)
            heads = sub(heads, scale(g, self.lr))
        clients = clients._replace(part=scatter(part, new, heads))
        return ServerState(params=state.params, extra=state.extra, clients=clients)

    def _onboard_batchnorm(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor, body: Params,
                           heads: Params, cov: Params, cond: Tensor) -> ServerState:
        """`onboard` of a BatchNorm model: the same SGD steps of the head, each forward in train mode."""
        body = self.with_own_statistics(state, body, new)
        hw, hb = head_names(state.params)

        def loss(q: Params, cov: Params, cond: Tensor, x: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(F.linear(cov_forward(cov, engine.features(q, x), cond), q[hw], q[hb]), y)

        local = PartLocal(params={**body, **heads})
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _, local = self.value_and_grad(engine, local, "params", loss, cov, cond, x, y)
            local = local._replace(params={**local.params, **sub(heads, scale(only(g, heads), self.lr))})
            heads = only(local.params, heads)
        clients = state.clients._replace(part=scatter(state.clients.part, new, heads))
        return ServerState(params=state.params, extra=state.extra, clients=clients,
                           trainer=self.kept_own_statistics(state, new, local.params))


def conditions(emb: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """(generic, personalized) conditions [m, d] from embeddings [m, K, d] and class counts [m, K]:
    the mean embedding, and the embeddings weighted by the client's class shares."""
    share = counts / counts.sum(-1, keepdim=True).clamp(min=1)
    return emb.mean(1), (share.unsqueeze(-1) * emb).sum(1)


def cov_forward(cov: Params, feat: Tensor, cond: Tensor) -> Tensor:
    """CoV(f, c) = ReLU(f * (gamma(c) + 1) + beta(c)), gamma / beta = LayerNorm(ReLU(Linear(c)))."""
    d = cond.shape[-1]
    gamma = F.layer_norm(F.relu(F.linear(cond, cov["gamma.weight"], cov["gamma.bias"])), (d,),
                         cov["gamma.ln.weight"], cov["gamma.ln.bias"])
    beta = F.layer_norm(F.relu(F.linear(cond, cov["beta.weight"], cov["beta.bias"])), (d,),
                        cov["beta.ln.weight"], cov["beta.ln.bias"])
    return F.relu(feat * (gamma + 1) + beta)


def gce_loss(E: Tensor, feat: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of the cosine similarities of the features [B, d] to the class embeddings E [K, d]."""
    cos = F.normalize(feat) @ F.normalize(E).T
    return F.cross_entropy(cos, y)


def per_client_pass(engine: Engine, fn, params: Params, cov: Params, cond: Tensor, split: ClientSplit):
    """Per-client sums of fn(p_c, cov, cond_c, x, y, mask) -> (loss, correct) over every client's rows
    in `split`: vmapped over padded row chunks (each with its owner's params), or client by client on
    the loop engine (the reference)."""
    C = split.num_clients
    if engine.name == "loop":
        out = []
        for c in range(C):
            rows = split.client_rows(c)
            x, y = split.x[rows], split.y[rows]
            out.append(fn({k: v[c] for k, v in params.items()}, cov, cond[c], x, y,
                          torch.ones(len(y), dtype=cond.dtype, device=y.device)))
        return tuple(torch.stack([o[i] for o in out]) for i in range(2))
    owner = split.chunk_client
    x, y = split.rows(split.chunk_idx)
    p = {k: v[owner] for k, v in params.items()}
    loss, correct = vmap(fn, in_dims=(0, None, 0, 0, 0, 0))(p, cov, cond[owner], x, y, split.chunk_mask.to(cond.dtype))
    zero = torch.zeros(C, dtype=loss.dtype, device=loss.device)
    return zero.index_add(0, owner, loss), zero.index_add(0, owner, correct)
