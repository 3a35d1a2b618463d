"""FedCP (Zhang, Hua, Wang, Cao, Guan, KDD 2023): federated conditional policy.

A conditional policy network (CPN) beside the model splits each sample's feature f [d] (the body's
output) into a personalized and a global part: with the client's condition c [d] (the L2-normalized
row sum of its personalized head's weight), the CPN's logits z = ReLU(LN(W (f * c) + b)) [2, d] give
the gate (p, g) = gumbel_softmax(z, over the pair, tau 1, soft): p + g = 1 per coordinate. The output is

    head_i(f * p) + head_g(f * g)

(head_i the client's personalized head, trained; head_g the received global head, frozen in the
round). A local step on one minibatch takes SGD of lr on the body, head_i and the CPN of

    CE(output, y) + lam MMD(f, f0)

with f0 the features of the round's received (frozen) body and MMD PFLlib's RBF estimate (bandwidths
10, 15, 20, 50). After the round the client uploads its body, its CPN and head_g' = (head_i + head_g)/2;
the server averages (`weights`) the three; each client keeps head_i and sets its condition from it.
Served: the same output with the noise-free gate softmax(z) (PFLlib's evaluation draws noise).

The Gumbel noise of every step is a counter-based hash of (the run's key, round, client, step,
coordinate) -> uniform -> -log(-log u): vectorized, on the device, no host reads, the same on every
engine and for batched seeds; the run's key, the initial conditions (uniform [0, 1), as PFLlib's
torch.rand) and the CPN's initial parameters are drawn from a generator seeded by the model's initial
parameters. `gumbel` is the one place the noise comes from (the golden trace feeds PFLlib's there).

A round is `tau` steps; with `local_epochs` set, `local_epochs` passes over the client's rows
(PFLlib's, `base.Phase`; tau unused).

follow=pfllib (protocol=official): PFLlib's servercp sends the new global head and CPN to the round's
selected clients only, so a client starts its next round from the ones of the last round it took part
in (`FedCPClients.head_g`, `.cpn`); follow=paper: every client starts from the current global ones (the
server's broadcast; the two fields are {}). `FedCPClients.cond["ctx"]` [C, d] holds every client's
condition (unnormalized: random until its first round, then its head's row sum). A round's clients
hold a `FedCPLocal`.

BatchNorm (the body's layers; PFLlib's clientCP trains its `Ensemble` in train()): a step's forward of
the trained model runs in training mode (the minibatch's statistics; the body's running statistics
move, once a step); so does the frozen copy of the received body in the MMD term (PFLlib's
`Ensemble.base`, in train() with the rest: batch statistics), whose own running statistics are never
read (only `test_metrics` runs in eval(), and it does not call the copy), so they are dropped. The
body's statistics go where the body goes: averaged with it by the server (`bn=averaged`), or each
client's own (`bn=local`, PFLlib's: `set_parameters` writes parameters only), the model a client is
served carrying them (PFLlib scores each client's own model). A held-out client's onboarding steps
run in training mode too; under `bn=local` the statistics they move (from its own, the initial
model's) are the ones it is served with, under `bn=averaged` it is served the server's.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..engine import Engine
from ..engine.tree import (
    Params,
    add,
    expand,
    gather,
    head_names,
    is_buffer,
    only,
    param_names,
    scale,
    scatter,
    stack,
    sub,
    weighted_mean,
)
from .base import EvalContext, Phase, ServerState
from .bodyhead import PartSharing
from .checks import check_choice, check_optional_int, check_positive
from .gpfl import JointLocal, per_client_pass, tagged, untagged
from .personalize import onboarding_batches
from .trainer import slot_of

CPN_KEYS = ("fc.weight", "fc.bias", "ln.weight", "ln.bias")
M32 = 0xFFFFFFFF
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


class FedCPClients(NamedTuple):
    part: Params  # every client's personalized head head_i (`bodyhead.PartSharing`)
    cond: dict  # {"ctx": [C, d]}: every client's condition, unnormalized
    head_g: Params = {}  # follow=pfllib: every client's copy of the global head ({} under follow=paper)
    cpn: Params = {}  # follow=pfllib: every client's copy of the CPN ({} under follow=paper)


class FedCPLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the received body with each one's head)
    cpn: Params  # the CPN each client trains
    head_g: Params  # the global head it received (frozen)
    frozen: Params  # the received body (frozen: the MMD term's reference features)
    ctx: Tensor  # [m, d] its condition
    cid: Tensor  # [m] its client ids
    key: Tensor  # [m] its noise key of the round
    step: Tensor  # [m] the local steps it has taken this round
    opt: dict = {}  # the local trainer's optimizer state, by slot: "opt" (the model's), "opt.cpn"


class FedCP(PartSharing):
    name = "fedcp"
    personal_part = "head"
    # its step is one SGD step of PFLlib's one optimizer over the model and the CPN: optim.* applies to both,
    # as two slots (`optim_slots`: the model's "opt", the CPN's "opt.cpn") that step together; every
    # optimizer of optim.* keeps per-parameter state only, so one slot over both would give the same numbers
    optim_ok = True
    # the trained body's statistics move with its training-mode forwards; the frozen copy's (also training mode:
    # batch statistics) are dropped; served: the server's (bn=averaged) or each client's own (bn=local)
    batchnorm_ok = True
    models_per_round = 1
    Clients = FedCPClients
    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}
    agreement_options = dict(lr=0.05, lam=1.0)

    def __init__(self, lr: float, lam: float, local_epochs: int | None, follow: str | None,
                 new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_positive("algo.lam", lam, allow_zero=True)
        check_optional_int("algo.local_epochs", local_epochs, 1)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        self.lam, self.local_epochs, self.follow = lam, local_epochs, follow or "paper"

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        from ..errors import ConfigError
        if len(head_names(params)) != 2:
            raise ConfigError(f"algo={self.name} needs a model whose output layer is one linear layer "
                              f"(weight and bias)")

    def set_finetuning(self, steps: int, epochs: int | None, lr: float | None) -> None:
        super().set_finetuning(steps, epochs, lr)
        if steps or epochs:
            from ..errors import ConfigError
            raise ConfigError("algo=fedcp serves its models through its CPN and global head, which the generic "
                              "fine-tuning does not use: set algo.finetune_steps=0 and algo.finetune_epochs=null")

    # -- state ------------------------------------------------------------------------------------
    def init_modules(self, params: Params, num_clients: int) -> dict:
        """The CPN's initial parameters (nn.Linear(d, 2d) as PyTorch initializes it, LayerNorm ones /
        zeros), every client's initial condition (uniform [0, 1)) and the run's noise key, from a
        generator seeded by the model's initial parameters."""
        w = params[head_names(params)[0]]
        d = w.shape[1]
        first = next(iter(params.values()))
        seed = int(first.double().flatten()[:64].mul(1e6).round().abs().sum().item()) % (2 ** 62)
        g = torch.Generator().manual_seed(seed)
        bound = 1 / math.sqrt(d)
        u = lambda *shape: (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1) * bound
        cpn = {"fc.weight": u(2 * d, d), "fc.bias": u(2 * d), "ln.weight": torch.ones(2 * d, dtype=torch.float64),
               "ln.bias": torch.zeros(2 * d, dtype=torch.float64)}
        ctx = torch.rand(num_clients, d, generator=g, dtype=torch.float64)
        key = torch.randint(0, 2 ** 32, (), generator=g)
        cast = lambda t: t.to(dtype=w.dtype, device=w.device)
        return {"cpn": {k: cast(v) for k, v in cpn.items()}, "ctx": cast(ctx), "key": key.to(w.device)}

    def init(self, params: Params, num_clients: int) -> ServerState:
        part = self.initial_part(params, num_clients)
        mods = self.init_modules(params, num_clients)
        hw, hb = head_names(params)
        head_g = {"weight": params[hw], "bias": params[hb]}
        clients = FedCPClients(part=part, cond={"ctx": mods["ctx"]})
        if self.follow == "pfllib":  # each client's own copies, replaced only when it is selected
            clients = clients._replace(head_g=stack(head_g, num_clients), cpn=stack(mods["cpn"], num_clients))
        return ServerState(params=params, extra={"cpn": mods["cpn"], "head_g": head_g, "key": mods["key"]},
                           clients=clients)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedCPLocal:
        local = super().client_init(state, clients, rnd)
        m = len(clients)
        if self.follow == "pfllib":
            head_g, cpn = gather(state.clients.head_g, clients), gather(state.clients.cpn, clients)
        else:
            head_g, cpn = stack(state.extra["head_g"], m), stack(state.extra["cpn"], m)
        part = state.clients.part
        frozen = {k: v for k, v in stack(state.params, m).items() if k not in part}  # the received body
        key = mix32((state.extra["key"] + mix32(torch.full_like(clients, rnd) * 65599 + clients.long())) & M32)
        return FedCPLocal(params=local.params, cpn=cpn, head_g=head_g, frozen=frozen,
                          ctx=state.clients.cond["ctx"][clients], cid=clients.long(), key=key,
                          step=torch.zeros_like(key))

    # -- the round --------------------------------------------------------------------------------
    def phases(self) -> tuple[Phase, ...] | None:
        if self.local_epochs is None:
            return None
        return (Phase(self.train_step, epochs=self.local_epochs),)

    def client_step(self, engine: Engine, local: FedCPLocal, batches, rnd: int) -> FedCPLocal:
        return self.train_step(engine, local, batches, rnd)

    def gumbel(self, local: FedCPLocal, rnd: int, shape: tuple[int, ...]) -> Tensor:
        """The step's Gumbel noise [m, *shape] from each client's (key, step) counter."""
        return gumbel_noise(local.key, local.step, shape, local.ctx.dtype)

    def train_step(self, engine: Engine, local: FedCPLocal, batches, rnd: int) -> FedCPLocal:
        (x, y), = batches
        B, d = x.shape[1], local.ctx.shape[-1]
        noise = self.gumbel(local, rnd, (B, 2, d))
        head = head_names(local.params)
        lam = self.lam
        q = {**tagged(local.params, "m."), **tagged(local.cpn, "c."), **tagged(local.head_g, "g."),
             **tagged(local.frozen, "f.")}

        def loss(q: Params, x: Tensor, y: Tensor, ctx: Tensor, noise: Tensor) -> Tensor:
            model, cpn = untagged(q, "m."), untagged(q, "c.")
            hg = {k: v.detach() for k, v in untagged(q, "g.").items()}
            base = {k: v if is_buffer(k) else v.detach() for k, v in untagged(q, "f.").items()}
            feat = engine.features(model, x)
            out = cp_output(cpn, feat, ctx, noise, (model[head[0]], model[head[1]]), (hg["weight"], hg["bias"]))
            feat0 = engine.features({**base, head[0]: model[head[0]], head[1]: model[head[1]]}, x)
            return F.cross_entropy(out, y) + lam * mmd(feat, feat0.detach())

        # (training mode: the model's and the frozen copy's forwards each move their copy of the statistics)
        g, _, moved = self.value_and_grad(engine, JointLocal(q), "q", loss, x, y, local.ctx, noise)
        P = {**local.params, **{k: v for k, v in untagged(moved.q, "m.").items() if is_buffer(k)}}
        gm, gc = only(untagged(g, "m."), param_names(P)), untagged(g, "c.")
        lr = self.lr
        if self.optim.plain:  # (the arithmetic the golden traces pin)
            return local._replace(params={**P, **sub(only(P, gm), scale(gm, lr))}, cpn=sub(local.cpn, scale(gc, lr)),
                                  step=local.step + 1)
        local = self.descend(local._replace(params=P), "params", gm, lr, rnd)
        local = self.descend(local, "cpn", gc, lr, rnd)
        return local._replace(step=local.step + 1)

    def optim_slots(self, local: FedCPLocal) -> dict:
        return {**super().optim_slots(local), slot_of("cpn"): ("cpn", list(local.cpn))}

    # -- the server -------------------------------------------------------------------------------
    def server_update(self, state: ServerState, local: FedCPLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = super().server_update(state, local, clients, selected, weights)
        hw, hb = head_names(local.params)
        mine = {"weight": local.params[hw], "bias": local.params[hb]}
        upload = add(scale(mine, 0.5), scale(local.head_g, 0.5))  # generate_upload_head
        head_g = weighted_mean(gather(upload, selected), weights)
        cpn = weighted_mean(gather(local.cpn, selected), weights)
        ctx = state.clients.cond["ctx"].index_copy(0, clients, mine["weight"].sum(1))  # its head's row sum
        kept = new.clients._replace(cond={"ctx": ctx})
        if self.follow == "pfllib":  # set_head_g / set_cs: the round's clients only
            m = len(clients)
            kept = kept._replace(head_g=scatter(state.clients.head_g, clients, expand(head_g, m)),
                                 cpn=scatter(state.clients.cpn, clients, expand(cpn, m)))
        return ServerState(params=new.params, extra={**state.extra, "cpn": cpn, "head_g": head_g}, clients=kept)

    # -- serving ----------------------------------------------------------------------------------
    def _modules_of(self, state: ServerState, C: int) -> tuple[Params, Params]:
        if self.follow == "pfllib":
            return state.clients.head_g, state.clients.cpn
        return expand(state.extra["head_g"], C), expand(state.extra["cpn"], C)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        """Per-client tensors [C, ...]: each client's model (the global body, its head), its global
        head (`hg.*`), CPN (`cpn.*`) and condition (`ctx`)."""
        models, _ = super().personalize(engine, state, ctx)
        ctx_ = state.clients.cond["ctx"]
        head_g, cpn = self._modules_of(state, ctx_.shape[0])
        return {**models, **tagged(head_g, "hg."), **tagged(cpn, "cpn."), "ctx": ctx_}, None

    def score(self, engine: Engine, served, split):
        params = {k: v for k, v in served.items() if k != "ctx"}
        head = head_names({k: v for k, v in params.items() if not k.startswith(("hg.", "cpn."))})

        def fn(p: Params, _: Params, ctx: Tensor, x: Tensor, y: Tensor, mask: Tensor):
            model = {k: v for k, v in p.items() if not k.startswith(("hg.", "cpn."))}
            cpn = {k[4:]: v for k, v in p.items() if k.startswith("cpn.")}
            feat = engine.features(model, x)
            out = cp_output(cpn, feat, ctx, None, (model[head[0]], model[head[1]]), (p["hg.weight"], p["hg.bias"]))
            loss = (F.cross_entropy(out, y, reduction="none") * mask).sum()
            return loss, ((out.argmax(-1) == y).to(mask.dtype) * mask).sum()

        return per_client_pass(engine, fn, params, {}, served["ctx"], split)

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client receives the global body, global head and CPN (follow=pfllib: as its own
        copies) and keeps its initial condition (it never trained, as PFLlib's clients before their
        first round); it fits its head with the rest frozen: new_client_steps (null: tau) SGD steps of
        lr on the served (noise-free) output's cross-entropy over minibatches of its training rows, the
        forward in training mode (BatchNorm: under bn=local its own statistics move and are kept)."""
        m = len(new)
        clients = state.clients
        if self.follow == "pfllib":
            clients = clients._replace(head_g=scatter(clients.head_g, new, expand(state.extra["head_g"], m)),
                                       cpn=scatter(clients.cpn, new, expand(state.extra["cpn"], m)))
        part = clients.part
        body = self.with_own_statistics(state, {k: v for k, v in stack(state.params, m).items() if k not in part}, new)
        head_g, cpn = stack(state.extra["head_g"], m), stack(state.extra["cpn"], m)
        cond = clients.cond["ctx"][new]
        heads = gather(part, new)
        hw, hb = head_names(state.params)

        def loss(h: Params, body: Params, cpn: Params, hg: Params, cond: Tensor, x: Tensor, y: Tensor) -> Tensor:
            feat = engine.features({**body, **h}, x)
            return F.cross_entropy(cp_output(cpn, feat, cond, None, (h[hw], h[hb]), (hg["weight"], hg["bias"])), y)

        q = {**tagged(heads, "h."), **tagged(body, "b."), **tagged(cpn, "c."), **tagged(head_g, "g.")}
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):  # (training mode: the statistics move)
            g, _, moved = self.value_and_grad(engine, JointLocal(q), "q", lambda q, c, x, y: loss(
                untagged(q, "h."), untagged(q, "b."), untagged(q, "c."), untagged(q, "g."), c, x, y), cond, x, y)
            q = {k: v - self.lr * g[k] if k.startswith("h.") else moved.q[k] for k, v in q.items()}
        clients = clients._replace(part=scatter(part, new, untagged(q, "h.")))
        trainer = self.kept_own_statistics(state, new, untagged(q, "b."))
        return ServerState(params=state.params, extra=state.extra, clients=clients, trainer=trainer)


def cp_output(cpn: Params, feat: Tensor, ctx: Tensor, noise: Tensor | None, head_p: tuple, head_g: tuple) -> Tensor:
    """head_p(f * p) + head_g(f * g), (p, g) the CPN's gate of features [B, d] under condition ctx [d]
    (Gumbel noise [B, 2, d], or None: the noise-free softmax)."""
    d = feat.shape[-1]
    z = F.linear(feat * F.normalize(ctx, dim=-1), cpn["fc.weight"], cpn["fc.bias"])
    z = F.relu(F.layer_norm(z, (2 * d,), cpn["ln.weight"], cpn["ln.bias"])).view(*feat.shape[:-1], 2, d)
    gate = torch.softmax(z if noise is None else z + noise, dim=-2)
    return F.linear(feat * gate[..., 0, :], *head_p) + F.linear(feat * gate[..., 1, :], *head_g)


def mmd(x: Tensor, y: Tensor) -> Tensor:
    """PFLlib's RBF estimate of the maximum mean discrepancy of the rows of x and y [B, d]."""
    sx, sy = (x * x).sum(-1), (y * y).sum(-1)
    dxx = sx.unsqueeze(0) + sx.unsqueeze(1) - 2 * x @ x.T
    dyy = sy.unsqueeze(0) + sy.unsqueeze(1) - 2 * y @ y.T
    dxy = sx.unsqueeze(1) + sy.unsqueeze(0) - 2 * x @ y.T
    k = lambda dist: sum(torch.exp(-0.5 * dist / a) for a in BANDWIDTHS)
    return (k(dxx) + k(dyy) - 2 * k(dxy)).mean()


def mix32(x: Tensor) -> Tensor:
    """An integer hash of 32-bit values held in int64 (products stay below 2^60: no overflow)."""
    x = x & M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & M32
    return x ^ (x >> 16)


def gumbel_noise(key: Tensor, step: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Standard Gumbel draws [m, *shape] from each client's key [m] and step counter [m] (int64)."""
    n = math.prod(shape)
    base = mix32(key ^ mix32(step * 0x9E37 + 0x7F4A))
    e = torch.arange(n, device=key.device)
    bits = mix32(mix32(base.unsqueeze(-1) + e * 0x3C6EF) ^ base.unsqueeze(-1))
    u = (bits.double() + 0.5) / 2.0 ** 32
    return (-torch.log(-torch.log(u))).to(dtype).view(len(key), *shape)
