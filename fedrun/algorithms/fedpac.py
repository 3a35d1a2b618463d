"""FedPAC (Xu, Tong, Huang, ICLR 2023): feature alignment and classifier collaboration.

The model is split at its output layer (`bodyhead.PartSharing`): the body (feature extractor) is
shared and averaged, each client keeps its head (classifier), `ServerState.clients.part` (a
`bodyhead.PartClients`; a round's clients hold a `FedPACLocal`). With
`local_epochs` set, a client's round is, as PFLlib's, passes over its own training rows (`base.Phase`,
epochs; tau and head_steps unused):

  1. statistics (1 pass, no training) of the received global body f: per class k the share p_k of
     the pass's rows, the mean feature mu_k and the summed squared norm S_k of the features; then
     h = [p_k mu_k]_k and V = (sum_k p_k S_k / n_k - p_k^2 ||mu_k||^2) / n (the authors' code, which
     PFLlib copies; n = the pass's rows);
  2. `head_epochs` passes of SGD on the head alone (body frozen), cross-entropy (the head's gradient
     alone, `LocalTrainer.grad`'s `wrt`: no backward through the body);
  3. `local_epochs` passes of SGD on the body alone (head frozen) on
        CE(head(f(x)), y) + lam * mean over the batch and the d features of (f(x) - c_y)^2,
     c_y the global prototype of y's class (rows of a class without one add 0);
  4. prototypes (1 pass, no training): the mean feature of each class under the trained body.

With `local_epochs` null (the default), the round is `tau` steps: the first `head_steps` train the
head and give the statistics (minibatch estimates), the others train the body and give the
prototypes (`client_step`).

Server: the body is averaged (`weights`); the global prototypes are the clients' class means,
averaged over the round's clients having the class (follow=pfllib: unweighted, PFLlib's FedProto
aggregation) or weighted by the clients' class counts (follow=paper); every round's replace the
last. Each sampled client i gets the head sum_j a_ij phi_j of the round's trained heads, a_i
minimizing a^T (diag(V) + D_i) a over the simplex, D_i[j, l] = sum_k <h_i^k - h_j^k, h_i^k - h_l^k>,
weights under 1e-3 set to 0 (not renormalized), as the authors' code (`simplex_qp`).

Held-out clients: their head is fitted with the body frozen (the head pass's update), new_client_steps
(null: tau) SGD steps of lr (`PartSharing.onboard`). Served models: the global body with each
client's head; the `global_*` metrics score the global body with the initial head.

BatchNorm models (PFLlib's clientPAC): every trained step (head or body, either form) is ONE forward
in train mode (batch statistics, the running ones updated once; the body's even while it is frozen,
as under clientPAC's model.train()); the statistics and prototype passes (no gradient) read the
features in eval mode with the client's current running statistics and leave them unchanged
(collect_protos' model.eval(); statistics_extraction's mode is whatever the client's model was left
in: eval from round 2 on, train in round 1 on a fresh model; fedrun: eval in every round). The
body's statistics go with the body: averaged (bn=averaged), or each client's own (bn=local: PFLlib's
server moves parameters only), the server's model carrying the first aggregated client's. Served
models carry the server's statistics (bn=averaged) or each client's own (bn=local); a held-out
client's head fit runs in train mode from its served statistics and, with bn=local, keeps the fit's.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

from ..engine import Engine
from ..engine.tree import Params, gather, head_names, only, param_names, per_client, scatter, weighted_mean
from .base import Phase, ServerState
from .bodyhead import PartSharing
from .checks import check_choice, check_int, check_optional_int, check_phase_passes, check_positive, check_split_round

EPS = 1e-3  # head weights below this are dropped (the authors' code)


class FedPACLocal(NamedTuple):
    params: Params  # the round's clients' whole models (the received body with each one's head)
    centers: Tensor  # [m, K, d] the global prototypes (expanded)
    present: Tensor  # [m, K] bool: which classes have one
    step: Tensor  # [m, 1] long: the local steps each client has taken this round (the tau path's phase)
    stat_sum: Tensor  # [m, K, d] the statistics pass's per-class feature sums,
    stat_count: Tensor  # [m, K] its per-class row counts
    stat_sq: Tensor  # [m] and its summed squared feature norms
    proto_sum: Tensor  # [m, K, d] the prototype pass's per-class feature sums
    proto_count: Tensor  # [m, K] and its per-class row counts
    opt: dict = {}  # the local trainer's optimizer state, by slot: "opt" (the body's), "opt.head"


class FedPAC(PartSharing):
    name = "fedpac"
    personal_part = "head"
    # its steps train the head, then the body (with the alignment term), each by its own SGD optimizer as
    # PFLlib's clientPAC (opt_head, optimizer): optim.* applies to each, two slots ("opt.head", "opt")
    optim_ok = True
    batchnorm_ok = True  # (module docstring: the trained steps in train mode, the no-gradient passes in eval mode)

    def optim_slots(self, local: FedPACLocal) -> dict:
        head = head_names(local.params)
        return {"opt": ("params", [k for k in param_names(local.params) if k not in head]),
                "opt.head": ("params", head)}
    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # PFLlib's unweighted prototype mean
    agreement_options = dict(lr=0.05, head_steps=1)  # fedrun.bench.agreement: both parts in tau=2

    def __init__(self, lr: float, lam: float, head_steps: int, head_epochs: int, local_epochs: int | None,
                 follow: str | None, new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_positive("algo.lam", lam, allow_zero=True)
        check_int("algo.head_steps", head_steps, 1)
        check_int("algo.head_epochs", head_epochs, 0)
        check_optional_int("algo.local_epochs", local_epochs, 1)
        check_phase_passes(self.name, "algo.head_epochs", head_epochs, local_epochs, "head")
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        self.lam, self.head_epochs, self.local_epochs, self.follow = lam, head_epochs, local_epochs, follow or "paper"
        self.head_steps = head_steps

    def check_tau(self, tau: int) -> None:
        check_split_round(self.name, self.head_steps, tau, self.local_epochs)

    # -- state ------------------------------------------------------------------------------------
    def init(self, params: Params, num_clients: int) -> ServerState:
        state = super().init(params, num_clients)
        K, d = _head_shape(params)
        w = params[head_names(params)[0]]
        return ServerState(params=state.params, clients=state.clients,
                           extra={"protos": torch.zeros(K, d, dtype=w.dtype, device=w.device),
                                  "present": torch.zeros(K, dtype=torch.bool, device=w.device)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedPACLocal:
        local = super().client_init(state, clients, rnd)
        m = len(clients)
        protos, present = state.extra["protos"], state.extra["present"]
        K, d = protos.shape
        z = lambda *shape: torch.zeros(m, *shape, dtype=protos.dtype, device=protos.device)
        return FedPACLocal(params=local.params, centers=protos.expand(m, K, d), present=present.expand(m, K),
                           step=torch.zeros(m, 1, dtype=torch.long, device=clients.device),
                           stat_sum=z(K, d), stat_count=z(K), stat_sq=z(), proto_sum=z(K, d), proto_count=z(K))

    # -- the round --------------------------------------------------------------------------------
    def phases(self) -> tuple[Phase, ...] | None:
        if self.local_epochs is None:
            return None
        return (Phase(self.stats_step, epochs=1), Phase(self.head_step, epochs=self.head_epochs),
                Phase(self.body_step, epochs=self.local_epochs), Phase(self.proto_step, epochs=1))

    def client_step(self, engine: Engine, local: FedPACLocal, batches, rnd: int) -> FedPACLocal:
        """The round in `tau` steps (local_epochs null): steps < head_steps train the head and add
        their minibatch to the statistics (the body is still the global one), the others train the
        body (alignment included) and add their minibatch, under the body before the step, to the
        prototypes: minibatch estimates of the passes the epochs form makes."""
        (x, y), = batches
        on_head = local.step < self.head_steps  # [m, 1]
        feats = stacked_features(engine, local.params, x)
        stats = _with_protos(_with_stats(local, feats, y, on_head), feats, y, ~on_head)
        # (one forward in train mode: a BatchNorm model's running statistics updated, on either part's steps)
        g, _, stats = self.value_and_grad(engine, stats, "params", self._aligned_loss(engine), x, y,
                                          local.centers, local.present)
        head = set(head_names(g))  # (its head gradient is the cross-entropy's: the alignment needs no head)
        p = stats.params
        if self.optim.plain:  # (the arithmetic the golden traces pin)
            new = {k: p[k] - self.lr * per_client(on_head if k in head else ~on_head, p[k]) * g[k] if k in g else p[k]
                   for k in p}
            return stats._replace(params=new, step=local.step + 1)
        on = on_head.view(-1)
        stats = self.descend(stats, "params", g, self.lr, rnd, names=head, slot="opt.head", live=on)
        stats = self.descend(stats, "params", g, self.lr, rnd, names=[k for k in g if k not in head], live=~on)
        return stats._replace(step=local.step + 1)

    def _aligned_loss(self, engine: Engine):
        lam = self.lam

        def loss(q: Params, x: Tensor, y: Tensor, centers: Tensor, present: Tensor) -> Tensor:
            feats, logits = _features_logits(engine, q, x)  # (one forward: PFLlib's head(base(x)))
            ce = F.cross_entropy(logits, y)
            # rows of a class without a global prototype: their own (detached) features, i.e. 0
            target = torch.where(present[y].unsqueeze(-1), centers[y], feats.detach())
            return ce + lam * ((target - feats) ** 2).mean()
        return loss

    def stats_step(self, engine: Engine, local: FedPACLocal, batches, rnd: int) -> FedPACLocal:
        (x, y), = batches
        return _with_stats(local, stacked_features(engine, local.params, x), y, None)

    def proto_step(self, engine: Engine, local: FedPACLocal, batches, rnd: int) -> FedPACLocal:
        (x, y), = batches
        return _with_protos(local, stacked_features(engine, local.params, x), y, None)

    def head_step(self, engine: Engine, local: FedPACLocal, batches, rnd: int) -> FedPACLocal:
        (x, y), = batches
        head = head_names(local.params)  # (the head's gradient only: no backward through the frozen body;
        g, _, local = self.grad(engine, local, "params", x, y, wrt=head)  # train mode: its statistics move too)
        return self.descend(local, "params", g, self.lr, rnd, names=head, slot="opt.head")

    def body_step(self, engine: Engine, local: FedPACLocal, batches, rnd: int) -> FedPACLocal:
        (x, y), = batches
        g, _, local = self.value_and_grad(engine, local, "params", self._aligned_loss(engine), x, y,
                                          local.centers, local.present)
        head = set(head_names(g))
        return self.descend(local, "params", g, self.lr, rnd, names=[k for k in g if k not in head])

    # -- the server -------------------------------------------------------------------------------
    def server_update(self, state: ServerState, local: FedPACLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        p = local.params
        head = head_names(p)
        body = weighted_mean(gather({k: v for k, v in p.items() if k not in head}, selected), weights)
        trained_heads = only(p, head)
        V, H = statistics(local.stat_sum[selected], local.stat_count[selected], local.stat_sq[selected])
        A = head_weights(V, H)  # [s, s]: row i, client selected[i]'s weights over the selected heads
        mixed = self.combine_heads(A, gather(trained_heads, selected))
        part = scatter(state.clients.part, clients, trained_heads)
        part = scatter(part, clients[selected], mixed)
        protos, present = self.global_prototypes(local.proto_sum[selected], local.proto_count[selected])
        return ServerState(params={**state.params, **body}, extra={**state.extra, "protos": protos, "present": present},
                           clients=state.clients._replace(part=part))

    def combine_heads(self, A: Tensor, heads: Params) -> Params:
        """Client i's new head sum_j A_ij phi_j of the selected clients' trained heads `heads` [s, ...]
        (paper); pfllib: client by client in order, each new head replacing that client's in the sum
        for the clients after it (PFLlib's set_head writes into the very head modules it sums over)."""
        if self.follow == "paper":
            return {k: torch.tensordot(A.to(v.dtype), v, dims=1) for k, v in heads.items()}
        heads = {k: v.clone() for k, v in heads.items()}
        for i in range(len(A)):
            for k, v in heads.items():
                v[i] = torch.tensordot(A[i].to(v.dtype), v, dims=1)
        return heads

    def global_prototypes(self, sums: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """[K, d] prototypes and [K] which classes have one, from the clients' per-class feature sums
        [s, K, d] and counts [s, K]: the mean of the clients' class means (pfllib) or the count-weighted
        mean (paper)."""
        has = counts > 0
        present = has.any(0)
        if self.follow == "paper":
            return sums.sum(0) / counts.sum(0).clamp(min=1).unsqueeze(-1), present
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        n = has.sum(0).clamp(min=1).to(sums.dtype)
        return (means * has.unsqueeze(-1)).sum(0) / n.unsqueeze(-1), present


def _head_shape(params: Params) -> tuple[int, int]:
    w = params[head_names(params)[0]]
    return w.shape[0], w.shape[-1]


def _features_logits(engine: Engine, p: Params, x: Tensor) -> tuple[Tensor, Tensor]:
    """(features, logits) of one forward (a BatchNorm model's statistics are updated once, as by
    PFLlib's head(base(x))); a model without features="both" runs its forward twice, but with
    BatchNorm the logits are its output layer applied to the features."""
    if getattr(engine.model, "features_and_logits", False):
        return engine.features_logits(p, x)
    if engine.batchnorm:
        feats = engine.features(p, x)
        w, b = head_names(p)
        return feats, F.linear(feats, p[w], p[b])
    return engine.features(p, x), engine.logits(p, x)


def stacked_features(engine: Engine, params: Params, x: Tensor) -> Tensor:
    """Every client's features [m, B, d] of its rows x [m, B, ...] under its own params (no gradient):
    one vmapped computation, or client by client on the loop engine (the reference)."""
    with torch.no_grad():
        if engine.name == "loop":
            return torch.stack([engine.features({k: v[i] for k, v in params.items()}, x[i]) for i in range(len(x))])
        return vmap(engine.features)(params, x)


def _class_onehot(feats: Tensor, y: Tensor, K: int, on: Tensor | None) -> Tensor:
    """[m, B, K]: the one-hot classes of the rows, zero for the clients where `on` [m, 1] is False."""
    onehot = (y.unsqueeze(-1) == torch.arange(K, device=y.device)).to(feats.dtype)
    return onehot if on is None else onehot * on.view(-1, 1, 1).to(feats.dtype)


def _with_stats(local: FedPACLocal, feats: Tensor, y: Tensor, on: Tensor | None) -> FedPACLocal:
    """`local`'s statistics (stat_*) plus the per-class feature sums, counts and summed squared norms of
    feats [m, B, d], for the clients where `on` [m, 1] (None: all)."""
    onehot = _class_onehot(feats, y, local.stat_count.shape[1], on)
    return local._replace(stat_sum=local.stat_sum + onehot.transpose(1, 2) @ feats,
                          stat_count=local.stat_count + onehot.sum(1),
                          stat_sq=local.stat_sq + (feats * feats * onehot.sum(-1, keepdim=True)).sum((1, 2)))


def _with_protos(local: FedPACLocal, feats: Tensor, y: Tensor, on: Tensor | None) -> FedPACLocal:
    """`local`'s prototype sums (proto_*) plus the per-class feature sums and counts of feats [m, B, d],
    for the clients where `on` [m, 1] (None: all)."""
    onehot = _class_onehot(feats, y, local.proto_count.shape[1], on)
    return local._replace(proto_sum=local.proto_sum + onehot.transpose(1, 2) @ feats,
                          proto_count=local.proto_count + onehot.sum(1))


def statistics(sums: Tensor, counts: Tensor, sq: Tensor) -> tuple[Tensor, Tensor]:
    """FedPAC's per-client feature statistics from one pass: V [s] and h [s, K, d] (see the module
    docstring): sum_k p_k S_k / n_k = sum_k S_k / n."""
    n = counts.sum(1).clamp(min=1)
    p = counts / n.unsqueeze(-1)
    mu = sums / counts.clamp(min=1).unsqueeze(-1)
    V = (sq / n - (p * p * (mu * mu).sum(-1)).sum(1)) / n
    return V, p.unsqueeze(-1) * mu


def head_weights(V: Tensor, H: Tensor) -> Tensor:
    """A [s, s]: row i the weights of client i's combined head, argmin over the simplex of
    a^T (diag(V) + D_i) a, D_i[j, l] = <H_i - H_j, H_i - H_l> (flattened over classes and features);
    weights under EPS set to 0. A matrix with a negative eigenvalue (rounding: it is PSD in exact
    arithmetic) is rebuilt from its eigenvalues >= 0.01, as the authors' code does.

    One host read a round (on CUDA): torch.linalg.eigh checks its solver's `info` on the host (torch has
    no eigh without that check), which waits for the server step's kernels queued since the round's
    divergence guard read (simulate._nonfinite_clients); tests/test_host_syncs.py names it. A
    sync-free eigensolver (fixed sweeps of Jacobi rotations) would queue thousands of small kernels a
    round in its place. Its eigenvalues also give `simplex_qp` its step (no second solver call)."""
    s = len(V)
    flat = H.reshape(s, -1)
    E = flat.unsqueeze(1) - flat.unsqueeze(0)  # [i, j, :] = H_i - H_j
    P = (torch.diag_embed(V.expand(s, s)) + E @ E.transpose(1, 2)).double()
    P = (P + P.transpose(1, 2)) / 2
    evals, evecs = torch.linalg.eigh(P)
    kept = evals * (evals >= 0.01)
    repaired = (evecs * kept.unsqueeze(1)) @ evecs.transpose(1, 2)
    negative = (evals < 0).any(-1)
    P = torch.where(negative.view(-1, 1, 1), repaired, P)
    a = simplex_qp(P, largest=torch.where(negative, kept[:, -1], evals[:, -1]))  # (ascending: the last)
    return (a * (a > EPS)).to(V.dtype)


def simplex_qp(P: Tensor, iters: int = 500, largest: Tensor | None = None) -> Tensor:
    """argmin_a a^T P a subject to a >= 0, sum a = 1, for a batch of PSD matrices P [b, s, s]: the
    exact solution on a support S (P_SS a_S proportional to 1, the optimality conditions checked):
    on every client's full support, else on the support that `iters` steps of accelerated projected
    gradient find, else that iterate. A fixed number of steps (each round's cost is known).

    `largest` [b]: P's largest eigenvalues (the step size; `head_weights` passes its eigh's). None:
    torch.linalg.eigvalsh computes them, which on CUDA reads its solver's `info` on the host; given,
    nothing here reads from the device."""
    b, s, _ = P.shape
    a, ok = _on_support(P, torch.ones(b, s, dtype=torch.bool, device=P.device))
    L = (torch.linalg.eigvalsh(P)[:, -1] if largest is None else largest).clamp(min=1e-300).view(b, 1)
    x = torch.full((b, s), 1.0 / s, dtype=P.dtype, device=P.device)
    z, t = x, 1.0
    for _ in range(iters):
        nxt = _project_simplex(z - (P @ z.unsqueeze(-1)).squeeze(-1) / L)  # step 1/(2 lambda_max) on a^T P a
        t_next = (1 + (1 + 4 * t * t) ** 0.5) / 2
        z = nxt + (t - 1) / t_next * (nxt - x)
        x, t = nxt, t_next
    polished, good = _on_support(P, x > 1e-9)
    return torch.where(ok.unsqueeze(-1), a, torch.where(good.unsqueeze(-1), polished, x))


def _on_support(P: Tensor, S: Tensor) -> tuple[Tensor, Tensor]:
    """The minimizer of a^T P a over the simplex restricted to the support S [b, s] (a_S = P_SS^-1 1 /
    1^T P_SS^-1 1, zero elsewhere) and whether it is the minimizer over the whole simplex (positive
    on S; the gradient off S not below the multiplier)."""
    b, s, _ = P.shape
    eye = torch.eye(s, dtype=P.dtype, device=P.device).expand(b, s, s)
    x, info = torch.linalg.solve_ex(torch.where(S.unsqueeze(-1) & S.unsqueeze(-2), P, eye), S.to(P.dtype))
    a = x / x.sum(-1, keepdim=True)
    grad = (P @ a.unsqueeze(-1)).squeeze(-1)
    lam = (grad * a).sum(-1, keepdim=True)
    ok = (info == 0) & torch.isfinite(a).all(-1) & ((a > 0) | ~S).all(-1) \
        & ((grad >= lam - 1e-9 * lam.abs().clamp(min=1e-300)) | S).all(-1)
    return torch.where(S, a, torch.zeros_like(a)), ok


def _project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of each row of v [b, s] onto the probability simplex."""
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    k = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    rho = ((u - css / k) > 0).to(v.dtype).cumsum(-1).argmax(-1, keepdim=True)  # last index where positive
    theta = css.gather(-1, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp(min=0)
