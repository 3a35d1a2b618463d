"""Every selectable branch of the methods (each `follow=` value, the steps and the epochs forms, the
onboarding of unseen clients, the schedules over rounds) against a HAND computation, under both
engines. The problem is tiny enough to write each update out in plain torch here: 2 training clients
of 2 rows each and one held-out client of 1 row, an MLP 3 -> 4 -> 3 in float64, every minibatch a
client's whole rows (batch_size 2, sampling=steps: each step's batch is a shuffle of its 2 rows; an
epochs pass is one such step; the held-out client's draws, with replacement, are its one row
repeated), every training client in every round. The expected numbers come from `f`/`grad` below
(plain autograd of the MLP's cross-entropy), never from fedrun's functions: fedrun's own outputs
are compared with them. The traces of tests/test_golden_pfllib*.py pin the follow=pfllib branches
against PFLlib itself; these pin the other branches (and pfllib's again, by its documented rule)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import APFL, APPLE, FedAMP, FedFomo, FedProto
from fedrun.algorithms.base import EvalContext, RunInfo
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.models import MLP
from fedrun.simulate import Schedule, simulate

ENGINES = [VmapEngine, LoopEngine]
D, K = 3, 3  # features, classes
LABELS = ([0, 1], [1, 1], [1])  # client 0, client 1 (training), client 2 (held out: one row); no class 2
TRAIN = 2  # training clients
# float64 throughout; a few dozen ops of magnitude ~1 per number: 1e-12 is far above the rounding
# (~1e-15) and far below any branch's effect
TOL = dict(rtol=1e-10, atol=1e-12)


def problem(holdout: bool = True):
    g = torch.Generator().manual_seed(3)
    labels = LABELS if holdout else LABELS[:TRAIN]
    sizes = torch.tensor([len(y) for y in labels])
    x = torch.randn(int(sizes.sum()), D, generator=g, dtype=torch.float64)
    y = torch.tensor([c for ys in labels for c in ys])
    split = ClientSplit.from_flat(x, y, sizes, 4)
    data = FederatedData("hand", split, ClientSplit.from_flat(x.clone(), y.clone(), sizes, 4), K,
                         num_holdout=1 if holdout else 0)
    torch.manual_seed(0)
    model = MLP(D, K, hidden=[4]).double()
    rows = [(x[s:s + n], y[s:s + n]) for s, n in zip([0, *sizes.cumsum(0)[:-1].tolist()], sizes.tolist())]
    return data, model, rows


def run(algo, engine_cls, rounds=2, tau=1, holdout=True):
    data, model, rows = problem(holdout)
    p0 = {k: v.detach().clone() for k, v in params_of(model).items()}
    engine = engine_cls(model)
    sched = Schedule(rounds=rounds, tau=tau, clients_per_round=TRAIN, batch_size=2, sampling="steps")
    algo = algo.bind(RunInfo.of(sched, data))  # (as the runner binds it; the held-out client's steps read the run)
    state, _ = simulate(algo, engine, data, params_of(model), sched, 0)
    return algo, state, engine, data, p0, rows


def onboard(algo, engine, state, data, steps):
    """`algo.onboard` of the held-out client (its draws: its one row, whatever the stream)."""
    ctx = EvalContext(data, torch.Generator().manual_seed(1), 2, steps)
    return algo.onboard(engine, state, ctx, torch.tensor([TRAIN]))


# ----------------------------------------------------------------------------------------------
# the hand computation: the MLP and its cross-entropy in plain torch
# ----------------------------------------------------------------------------------------------

def feats(p, x):
    return torch.relu(x @ p["net.0.weight"].T + p["net.0.bias"])


def logits(p, x):
    return feats(p, x) @ p["net.2.weight"].T + p["net.2.bias"]


def f(p, x, y):
    return F.cross_entropy(logits(p, x), y)


def grad(p, x, y, loss=f):
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    return dict(zip(q, torch.autograd.grad(loss(q, x, y), list(q.values()))))


def step(p, g, lr):
    return {k: p[k] - lr * g[k] for k in p}


def lerp(a, b, t):  # (1 - t) a + t b
    return {k: (1 - t) * a[k] + t * b[k] for k in a}


def mean(ps):
    return {k: sum(p[k] for p in ps) / len(ps) for k in ps[0]}


def sqdist(a, b):
    return sum(float(((a[k] - b[k]) ** 2).sum()) for k in a)


def close(got, want, c=None):
    for k in want:
        torch.testing.assert_close(got[k] if c is None else got[k][c], want[k], **TOL)


# ----------------------------------------------------------------------------------------------
# FedAMP: follow=paper (the proximal pull to u_i has a gradient) and pfllib (it has none), the
# steps and the epochs forms, and the held-out client's FedAMP steps toward its cloud model
# ----------------------------------------------------------------------------------------------

def fedamp_by_hand(p0, rows, follow, lr, lam, alpha_k, sigma, rounds, steps):
    w = [dict(p0) for _ in range(TRAIN)]
    sent = False

    def cloud(wi, i, models):
        xi = {j: alpha_k * math.exp(-sqdist(wi, wj) / sigma) / sigma for j, wj in enumerate(models) if j != i}
        return {k: (1 - sum(xi.values())) * wi[k] + sum(x * models[j][k] for j, x in xi.items()) for k in wi}

    def train(wi, u, x, y, n):
        for _ in range(n):
            g = grad(wi, x, y)
            if follow == "paper":
                g = {k: g[k] + lam / alpha_k * (wi[k] - u[k]) for k in g}
            wi = step(wi, g, lr)
        return wi

    for _ in range(rounds):
        us = [cloud(w[i], i, w) if sent else w[i] for i in range(TRAIN)]
        w = [train(w[i], us[i], *rows[i], steps) for i in range(TRAIN)]
        sent = True
    new = train(p0, cloud(p0, None, w), *rows[TRAIN], 2)  # the held-out client: new_client_steps=2
    return w, new


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
@pytest.mark.parametrize("form", ["steps", "epochs"])
def test_fedamp_by_hand(engine_cls, follow, form):
    opts = dict(lr=0.3, lam=0.7, alpha_k=0.8, sigma=2.0)
    algo = FedAMP(**opts, follow=follow, new_client_steps=2,
                  local_epochs=2 if form == "epochs" else None)  # epochs: 2 passes of 1 step; steps: tau 2
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2 if form == "steps" else 5)
    w, new = fedamp_by_hand(p0, rows, follow, **opts, rounds=2, steps=2)
    for i in range(TRAIN):
        close(state.clients.params, w[i], i)
    close(onboard(algo, engine, state, data, 4).clients.params, new, TRAIN)


# ----------------------------------------------------------------------------------------------
# APFL: follow=paper (v on the mixture's gradient, the served mixture with the new server model)
# and pfllib (v on its own loss, PFLlib's alpha rule, v <- the mixture after the round), and the
# held-out client's APFL steps
# ----------------------------------------------------------------------------------------------

def apfl_by_hand(p0, rows, follow, lr, alpha, alpha_lr, rounds, steps, new_steps):
    server = dict(p0)
    v = [dict(p0) for _ in range(TRAIN + 1)]
    a = [alpha] * (TRAIN + 1)

    def local(w, vi, ai, x, y, n):
        for _ in range(n):
            g = grad(w, x, y)
            if follow == "paper":
                vbar = lerp(w, vi, ai)
                gb = grad(vbar, x, y)
                dot = sum(float(((vi[k] - w[k]) * gb[k]).sum()) for k in w)
                vi = {k: vi[k] - lr * ai * gb[k] for k in w}
                ai = min(max(ai - alpha_lr * dot, 0.0), 1.0)
                w = step(w, g, lr)
            else:
                gv = grad(vi, x, y)
                w, vi = step(w, g, lr), step(vi, gv, lr)
                dot = sum(float(((vi[k] - w[k]) * (ai * gv[k] + (1 - ai) * g[k])).sum()) for k in w)
                ai = min(max(ai - alpha_lr * (dot + 0.02 * ai), 0.0), 1.0)
        if follow == "pfllib":
            vi = lerp(w, vi, ai)
        return w, vi, ai

    for _ in range(rounds):
        ws = []
        for i in range(TRAIN):
            wi, v[i], a[i] = local(server, v[i], a[i], *rows[i], steps)
            ws.append(wi)
        server = mean(ws)
    _, v[TRAIN], a[TRAIN] = local(server, server, alpha, *rows[TRAIN], new_steps)
    served = v if follow == "pfllib" else [lerp(server, v[i], a[i]) for i in range(TRAIN + 1)]
    return served, a


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
def test_apfl_by_hand(engine_cls, follow):
    opts = dict(lr=0.3, alpha=0.4, alpha_lr=0.2)
    algo = APFL(**opts, follow=follow, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2)
    state = onboard(algo, engine, state, data, 5)
    served, a = apfl_by_hand(p0, rows, follow, **opts, rounds=2, steps=2, new_steps=2)
    assert 0 < min(a) and max(a) < 1  # alpha moved and was not clipped
    got, _ = algo.personalize(engine, state, None)
    for i in range(TRAIN + 1):
        close(got, served[i], i)
        assert state.clients.mix["alpha"][i, 0].item() == pytest.approx(a[i], rel=1e-10)


# ----------------------------------------------------------------------------------------------
# APPLE: follow=paper (the trained core uploaded, served p_i . cores) and pfllib (theta_i uploaded
# and served), its proximal weight's cosine decay over decay_rounds, and the held-out client's
# steps learning p alone from p0
# ----------------------------------------------------------------------------------------------

def apple_by_hand(p0, rows, follow, lr, dr_lr, mu, L, rounds, new_steps):
    cores = [dict(p0) for _ in range(TRAIN + 1)]
    p = [[1 / TRAIN] * TRAIN for _ in range(TRAIN)]
    share = [len(r[1]) / sum(len(r[1]) for r in rows[:TRAIN]) for r in rows[:TRAIN]]  # p0 (rows 2 and 2)
    thetas = [dict(p0) for _ in range(TRAIN)]

    def lam(t):  # lam_1 = 1; lam_t = (cos((t - 2) pi / L) + 1) / 2 while t - 2 < L; then 0
        return 1.0 if t == 1 else ((math.cos((t - 2) * math.pi / L) + 1) / 2 if t - 2 < L else 0.0)

    def dots(g, c):  # the mean over tensors of the element-wise mean of g c
        return sum(float((g[k] * c[k]).mean()) for k in g) / len(g)

    def p_step(pi, g, cs, lt):
        return [pi[j] - dr_lr * (dots(g, cs[j]) + lt * mu * (pi[j] - share[j])) for j in range(TRAIN)]

    for t in range(1, rounds + 1):
        new_cores = []
        for i in range(TRAIN):
            cs = [cores[j] for j in range(TRAIN)]
            theta = {k: sum(p[i][j] * cs[j][k] for j in range(TRAIN)) for k in p0}
            g = grad(theta, *rows[i])
            own = step(cs[i], g, lr * p[i][i] * TRAIN)
            p[i] = p_step(p[i], g, [own if j == i else cs[j] for j in range(TRAIN)], lam(t))
            thetas[i] = theta
            new_cores.append(theta if follow == "pfllib" else own)
        cores[:TRAIN] = new_cores
    served = thetas if follow == "pfllib" else [{k: sum(p[i][j] * cores[j][k] for j in range(TRAIN)) for k in p0}
                                                for i in range(TRAIN)]
    q = list(share)  # the held-out client: p from p0 over the trained cores, its own core never moves
    for _ in range(new_steps):
        theta = {k: sum(q[j] * cores[j][k] for j in range(TRAIN)) for k in p0}
        q = p_step(q, grad(theta, *rows[TRAIN]), cores, lam(rounds + 1))
    served.append({k: sum(q[j] * cores[j][k] for j in range(TRAIN)) for k in p0})
    return served, p + [q], [lam(t) for t in range(1, rounds + 2)]


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow, form", [("paper", "steps"), ("pfllib", "steps"), ("paper", "epochs")])
def test_apple_by_hand(engine_cls, follow, form):
    opts = dict(lr=0.2, dr_lr=0.5, mu=0.6)
    algo = APPLE(**opts, decay=0.1, decay_rounds=2, follow=follow, new_client_steps=2,
                 local_epochs=1 if form == "epochs" else None)  # one step a round either way
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=3, tau=1 if form == "steps" else 5)
    state = onboard(algo, engine, state, data, 5)
    served, p, lams = apple_by_hand(p0, rows, follow, **opts, L=2, rounds=3, new_steps=2)
    assert lams == [1.0, 1.0, 0.5, 0.0]  # rounds 1..3 and the held-out client's
    got, _ = algo.personalize(engine, state, None)
    for i in range(TRAIN + 1):
        close(got, served[i], i)
        torch.testing.assert_close(state.clients.p["p"][i], torch.tensor(p[i] + [0.0], dtype=torch.float64), **TOL)


def test_apple_decay_as_a_fraction_of_the_rounds():
    """decay_rounds null: L = int(decay x rounds); lam over rounds 1..6 with L = int(0.5 x 6) = 3."""
    algo = APPLE(lr=0.1, dr_lr=0.1, mu=0.1, decay=0.5, decay_rounds=None)
    algo = algo.bind(RunInfo(rounds=6))
    want = [1.0, 1.0, 0.75, 0.25, 0.0, 0.0]  # (cos(t pi / 3) + 1) / 2 for t = 0, 1, 2; then 0
    assert [algo.lam_at(t) for t in range(1, 7)] == pytest.approx(want, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# FedFomo: follow=paper (w_n from the client's current model) and pfllib (from its model after its
# last mixture); the held-out client mixing the models the training clients valued most
# ----------------------------------------------------------------------------------------------

def fomo_mix(base, own, nbrs, x, y):
    lb = float(f(base, x, y))
    w = [(lb - float(f(n, x, y))) / (math.sqrt(sqdist(n, base)) + 1e-5) for n in nbrs]
    pos = [max(v, 0.0) for v in w]
    if sum(pos) == 0:
        return own, w
    return {k: sum(c * n[k] for c, n in zip(pos, nbrs)) / sum(pos) for k in own}, w


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
def test_fedfomo_by_hand(engine_cls, follow):
    lr = 0.4
    algo = FedFomo(lr=lr, M=2, val_batches=1, follow=follow)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=3, tau=2, holdout=False)
    models, old = [dict(p0) for _ in range(TRAIN)], [dict(p0) for _ in range(TRAIN)]
    P = [[1.0 if i == j else 0.0 for j in range(TRAIN)] for i in range(TRAIN)]
    for t in range(3):
        prev = [dict(m) for m in models]
        for i in range(TRAIN):
            if t > 0:  # round 1: no uploads yet, nothing to weigh; then both clients' (its own first)
                base = old[i] if follow == "pfllib" else prev[i]
                models[i], w = fomo_mix(base, prev[i], [prev[i], prev[1 - i]], *rows[i])
                P[i][i] += w[0]
                P[i][1 - i] += w[1]
            old[i] = dict(models[i])
            for _ in range(2):
                models[i] = step(models[i], grad(models[i], *rows[i]), lr)
    for i in range(TRAIN):
        close(state.clients.params, models[i], i)
        close(state.clients.old, old[i], i)
    torch.testing.assert_close(state.clients.affinity["P"], torch.tensor(P, dtype=torch.float64), **TOL)
    assert P[0][1] != 0 and P[1][0] != 0


@pytest.mark.parametrize("engine_cls", ENGINES)
def test_fedfomo_held_out_client_by_hand(engine_cls):
    """After one round (P still the identity: nothing weighed), the held-out client weighs both
    trained models from the initial one on its rows, mixes them, then takes new_client_steps SGD steps."""
    lr = 0.4
    algo = FedFomo(lr=lr, M=2, val_batches=1, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=1, tau=2)
    trained = []
    for i in range(TRAIN):
        m = dict(p0)
        for _ in range(2):
            m = step(m, grad(m, *rows[i]), lr)
        trained.append(m)
    mixed, w = fomo_mix(p0, p0, trained, *rows[TRAIN])
    assert max(w) > 0
    for _ in range(2):
        mixed = step(mixed, grad(mixed, *rows[TRAIN]), lr)
    close(onboard(algo, engine, state, data, 5).clients.params, mixed, TRAIN)


# ----------------------------------------------------------------------------------------------
# FedProto: follow=paper (global prototypes weighted by the clients' rows of the class) and pfllib
# (unweighted mean over the clients having it); its local loss; the held-out client's steps
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
def test_fedproto_by_hand(engine_cls, follow):
    lr, lam = 0.3, 0.9
    algo = FedProto(lr=lr, lam=lam, follow=follow, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2)
    protos, present = torch.zeros(K, 4, dtype=torch.float64), torch.zeros(K, dtype=torch.bool)

    def loss(p, x, y):
        z = feats(p, x)
        target = torch.where(present[y].unsqueeze(-1), protos[y], z.detach())
        return F.cross_entropy(z @ p["net.2.weight"].T + p["net.2.bias"], y) + lam * ((target - z) ** 2).mean()

    models = [dict(p0) for _ in range(TRAIN + 1)]
    for _ in range(2):
        sums, counts = torch.zeros(TRAIN, K, 4, dtype=torch.float64), torch.zeros(TRAIN, K, dtype=torch.float64)
        for i in range(TRAIN):
            x, y = rows[i]
            for _ in range(2):
                z = feats(models[i], x).detach()
                for r in range(len(y)):
                    sums[i, y[r]] += z[r]
                    counts[i, y[r]] += 1
                models[i] = step(models[i], grad(models[i], x, y, loss), lr)
        local = sums / counts.clamp(min=1).unsqueeze(-1)
        wts = counts if follow == "paper" else (counts > 0).double()
        present = counts.sum(0) > 0
        protos = torch.where(present.unsqueeze(-1), (wts.unsqueeze(-1) * local).sum(0)
                             / wts.sum(0).clamp(min=1e-30).unsqueeze(-1), torch.zeros(K, 4, dtype=torch.float64))
    for _ in range(2):
        models[TRAIN] = step(models[TRAIN], grad(models[TRAIN], *rows[TRAIN], loss), lr)
    state = onboard(algo, engine, state, data, 5)
    assert present.tolist() == [True, True, False]
    torch.testing.assert_close(state.extra["protos"], protos, **TOL)
    torch.testing.assert_close(state.extra["present"], present)
    for i in range(TRAIN + 1):
        close(state.clients.params, models[i], i)


# ----------------------------------------------------------------------------------------------
# FedPAC: follow=paper (heads combined from the trained heads, prototypes weighted by rows) and
# pfllib (each combined head replacing its own in the sum for the next client, PFLlib's set_head;
# the unweighted mean of the clients' class means), in the steps form (head_steps then the body;
# prototypes under the body before its step) and the epochs form (a statistics pass, head passes,
# body passes, a prototype pass under the trained body); the held-out client's head fitted alone
# ----------------------------------------------------------------------------------------------

HEAD = ("net.2.weight", "net.2.bias")


def fedpac_by_hand(p0, rows, follow, lr, lam, form, rounds, new_steps):
    body = {k: v for k, v in p0.items() if k not in HEAD}
    heads = [{k: p0[k] for k in HEAD} for _ in range(TRAIN + 1)]
    protos, present = torch.zeros(K, 4, dtype=torch.float64), torch.zeros(K, dtype=torch.bool)

    def aligned(p, x, y):
        z = feats(p, x)
        target = torch.where(present[y].unsqueeze(-1), protos[y], z.detach())
        return F.cross_entropy(z @ p["net.2.weight"].T + p["net.2.bias"], y) + lam * ((target - z) ** 2).mean()

    def class_sums(z, y):
        s, c = torch.zeros(K, 4, dtype=torch.float64), torch.zeros(K, dtype=torch.float64)
        for r in range(len(y)):
            s[y[r]] += z[r]
            c[y[r]] += 1
        return s, c

    for _ in range(rounds):
        bodies, trained, V, H, psums, pcounts = [], [], [], [], [], []
        for i in range(TRAIN):
            x, y = rows[i]
            p = {**body, **heads[i]}
            z = feats(p, x).detach()  # statistics under the received body
            s, c = class_sums(z, y)
            n = c.sum()
            mu = s / c.clamp(min=1).unsqueeze(-1)
            share = c / n
            V.append(float(((z * z).sum() / n - (share ** 2 * (mu * mu).sum(-1)).sum()) / n))
            H.append(share.unsqueeze(-1) * mu)
            g = grad(p, x, y)  # the head's step: cross-entropy only (the alignment has no head gradient)
            p = {k: p[k] - lr * g[k] if k in HEAD else p[k] for k in p}
            before = feats(p, x).detach()
            g = grad(p, x, y, aligned)
            p = {k: p[k] if k in HEAD else p[k] - lr * g[k] for k in p}
            s, c = class_sums(before if form == "steps" else feats(p, x).detach(), y)
            psums.append(s)
            pcounts.append(c)
            bodies.append({k: p[k] for k in p if k not in HEAD})
            trained.append({k: p[k] for k in HEAD})
        d = float(((H[0] - H[1]) ** 2).sum())
        A = []
        for i in range(TRAIN):  # argmin a^T (diag(V) + D_i) a on the simplex: D_i = d off client i's own entry
            q = [V[j] + (d if j != i else 0.0) for j in range(TRAIN)]
            a = [1 / qj / sum(1 / qk for qk in q) for qj in q]
            assert min(a) > 1e-3
            A.append(a)
        for i in range(TRAIN):
            src = trained if follow == "paper" else heads[:i] + trained[i:]
            heads[i] = {k: sum(A[i][j] * src[j][k] for j in range(TRAIN)) for k in HEAD}
        body = mean(bodies)
        sums, counts = torch.stack(psums), torch.stack(pcounts)
        present = counts.sum(0) > 0
        if follow == "paper":
            protos = sums.sum(0) / counts.sum(0).clamp(min=1).unsqueeze(-1)
        else:
            has = counts > 0
            protos = ((sums / counts.clamp(min=1).unsqueeze(-1)) * has.unsqueeze(-1)).sum(0) \
                / has.sum(0).clamp(min=1).unsqueeze(-1)
    p = {**body, **heads[TRAIN]}
    for _ in range(new_steps):
        g = grad(p, *rows[TRAIN])
        p = {k: p[k] - lr * g[k] if k in HEAD else p[k] for k in p}
    heads[TRAIN] = {k: p[k] for k in HEAD}
    return body, heads, protos, present


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
@pytest.mark.parametrize("form", ["steps", "epochs"])
def test_fedpac_by_hand(engine_cls, follow, form):
    from fedrun.algorithms import FedPAC

    lr, lam = 0.3, 0.8
    algo = FedPAC(lr=lr, lam=lam, head_steps=1, head_epochs=1, local_epochs=1 if form == "epochs" else None,
                  follow=follow, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2)
    state = onboard(algo, engine, state, data, 5)
    body, heads, protos, present = fedpac_by_hand(p0, rows, follow, lr, lam, form, rounds=2, new_steps=2)
    close(state.params, body)
    for i in range(TRAIN + 1):
        close(state.clients.part, heads[i], i)
    torch.testing.assert_close(state.extra["protos"], protos, **TOL)
    torch.testing.assert_close(state.extra["present"], present)


# ----------------------------------------------------------------------------------------------
# FedPHP: mu_t = mu (t - 1) / T over rounds (T = mu_rounds, or the run's rounds), both served
# models (serve=local | hpm), the steps and the epochs forms, the held-out client's steps
# ----------------------------------------------------------------------------------------------

def mmd(a, b):
    k = lambda u, v: sum(torch.exp(-((u[:, None] - v[None]) ** 2).sum(-1) / (2 * s)) for s in (10.0, 15.0, 20.0, 50.0))
    return (k(a, a) + k(b, b) - 2 * k(a, b)).mean()


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("serve, mu_rounds, form", [("local", 2, "steps"), ("hpm", None, "epochs")])
def test_fedphp_by_hand(engine_cls, serve, mu_rounds, form):
    from fedrun.algorithms import FedPHP

    lr, mu, lam, rounds = 0.3, 0.6, 0.4, 3
    algo = FedPHP(lr=lr, mu=mu, lam=lam, mu_rounds=mu_rounds, serve=serve,
                  local_epochs=2 if form == "epochs" else None, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=rounds, tau=2 if form == "steps" else 5)
    state = onboard(algo, engine, state, data, 5)
    T = mu_rounds or rounds
    mus = [min(mu * (t - 1) / T, mu) for t in range(1, rounds + 1)]
    assert mus == pytest.approx([0.0, mu / T, 2 * mu / T if T == 3 else mu])

    def train(p, v, x, y):
        loss = lambda q, x, y: (1 - lam) * f(q, x, y) + lam * mmd(feats(q, x), feats(v, x).detach())
        for _ in range(2):
            p = step(p, grad(p, x, y, loss), lr)
        return p

    server, hist, own = dict(p0), [dict(p0) for _ in range(TRAIN + 1)], [dict(p0) for _ in range(TRAIN + 1)]
    for t in range(rounds):
        for i in range(TRAIN):
            own[i] = train(server, hist[i], *rows[i])
            hist[i] = lerp(own[i], hist[i], mus[t])
        server = mean(own[:TRAIN])
    own[TRAIN] = hist[TRAIN] = train(server, p0, *rows[TRAIN])  # then v takes it whole (mu_t = 0)
    got, _ = algo.personalize(engine, state, None)
    for i in range(TRAIN + 1):
        close(got, (own if serve == "local" else hist)[i], i)
    close(state.params, server)


# ----------------------------------------------------------------------------------------------
# FedALA: round 1 skips the ALA (every local model is the server's); a client's first ALA walks
# start_epochs passes, later ones one pass (ala_steps minibatches, or an epochs pass of its rows);
# then tau steps or local_epochs passes of SGD; the held-out client's SGD from the server model
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("form", ["steps", "epochs"])
def test_fedala_by_hand(engine_cls, form):
    from fedrun.algorithms import FedALA

    lr, eta, start = 0.3, 2.0, 3
    epochs = form == "epochs"
    algo = FedALA(lr=lr, eta=eta, layer_idx=2, start_epochs=start, ala_steps=None if epochs else 1,
                  local_epochs=2 if epochs else None, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=3, tau=2 if form == "steps" else 5)
    state = onboard(algo, engine, state, data, 5)
    server, models = dict(p0), [dict(p0) for _ in range(TRAIN + 1)]
    W = [{k: torch.ones_like(p0[k]) for k in HEAD} for _ in range(TRAIN)]
    started = [False] * TRAIN
    ala_steps = []
    for t in range(3):
        for i in range(TRAIN):
            l = models[i]
            active = float((server["net.0.weight"] - l["net.0.weight"]).sum()) != 0
            theta = {k: (l[k] + (server[k] - l[k]) * W[i][k] if k in HEAD else server[k]) if active else l[k]
                     for k in l}
            n = (start if not started[i] else 1) if active else 0
            ala_steps.append(n)
            for _ in range(n):
                g = grad(theta, *rows[i])
                for k in HEAD:
                    W[i][k] = (W[i][k] - eta * g[k] * (server[k] - l[k])).clamp(0, 1)
                    theta[k] = l[k] + (server[k] - l[k]) * W[i][k]
            started[i] |= active
            for _ in range(2):
                theta = step(theta, grad(theta, *rows[i]), lr)
            models[i] = theta
        server = mean(models[:TRAIN])
    assert ala_steps == [0, 0, start, start, 1, 1]
    assert all(not torch.equal(W[i][k], torch.ones_like(W[i][k])) for i in range(TRAIN) for k in HEAD)  # W learned
    p = dict(server)
    for _ in range(2):
        p = step(p, grad(p, *rows[TRAIN]), lr)
    models[TRAIN] = p
    for i in range(TRAIN + 1):
        close(state.clients.params, models[i], i)
    for i in range(TRAIN):
        close(state.clients.weights, W[i], i)


# ----------------------------------------------------------------------------------------------
# FedRoD: the generic model on the balanced softmax (logits + log n_c), the personal head on the
# summed logits; the held-out client's personal head fitted with the server's generic model fixed
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_cls", ENGINES)
def test_fedrod_by_hand(engine_cls):
    from fedrun.algorithms import FedRoD

    lr = 0.3
    algo = FedRoD(lr=lr, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2)
    state = onboard(algo, engine, state, data, 5)
    counts = [torch.bincount(y, minlength=K).double() for _, y in rows]

    def rod_step(p, h, x, y, n, generic=True):
        hp = {k: v.detach().clone().requires_grad_(True) for k, v in h.items()}
        z, out = feats(p, x).detach(), logits(p, x).detach()
        mine = z @ hp["net.2.weight"].T + hp["net.2.bias"]
        gh = torch.autograd.grad(F.cross_entropy(out + mine, y), list(hp.values()))
        h = {k: h[k] - lr * g for (k, g) in zip(hp, gh)}
        if generic:
            p = step(p, grad(p, x, y, lambda q, x, y: F.cross_entropy(logits(q, x) + n.log(), y)), lr)
        return p, h

    server, heads = dict(p0), [{k: p0[k] for k in HEAD} for _ in range(TRAIN + 1)]
    for _ in range(2):
        models = []
        for i in range(TRAIN):
            p = dict(server)
            for _ in range(2):
                p, heads[i] = rod_step(p, heads[i], *rows[i], counts[i])
            models.append(p)
        server = mean(models)
    for _ in range(2):
        _, heads[TRAIN] = rod_step(server, heads[TRAIN], *rows[TRAIN], counts[TRAIN], generic=False)
    close(state.params, server)
    got, _ = algo.personalize(engine, state, None)
    for i in range(TRAIN + 1):
        close(state.clients.head, heads[i], i)
        close(got, {**server, **{k: server[k] + heads[i][k] for k in HEAD}}, i)


# ----------------------------------------------------------------------------------------------
# GPFL: follow=paper (the conditions from the received global GCE) and pfllib (from the GCE the
# client holds before it takes the new one: its trained copy, zero before the first round), the
# steps and the epochs forms; served conditions from the clients' class shares; the held-out
# client's head fitted through the frozen CoV, its conditions from the global GCE
# ----------------------------------------------------------------------------------------------

def cov_by_hand(cov, f_, c):
    def branch(name):
        h = torch.relu(c @ cov[f"{name}.weight"].T + cov[f"{name}.bias"])
        h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
        return h * cov[f"{name}.ln.weight"] + cov[f"{name}.ln.bias"]
    return torch.relu(f_ * (branch("gamma") + 1) + branch("beta"))


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow, form", [("paper", "steps"), ("paper", "epochs"), ("pfllib", "steps")])
def test_gpfl_by_hand(engine_cls, follow, form):
    from fedrun.algorithms import GPFL

    lr, lam, mu = 0.3, 0.5, 0.1
    algo = GPFL(lr=lr, lam=lam, mu=mu, local_epochs=2 if form == "epochs" else None, follow=follow, new_client_steps=2)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=2, tau=2 if form == "steps" else 5)
    state = onboard(algo, engine, state, data, 5)
    start = algo.init_modules(p0)  # the CoV's and GCE's initial values (inputs, not results)
    cov, E = dict(start["cov"]), start["gce"]
    body = {k: v for k, v in p0.items() if k not in HEAD}
    heads = [{k: p0[k] for k in HEAD} for _ in range(TRAIN + 1)]
    emb = [torch.zeros_like(E) for _ in range(TRAIN + 1)]  # pfllib's: zero before the first round
    shares = [torch.bincount(y, minlength=K).double() / len(y) for _, y in rows]

    def conds(e, s):
        return e.mean(0), (s.unsqueeze(-1) * e).sum(0)

    def loss(q, x, y, frozen, cg, cp):
        p = {**{k: q[k] for k in p0}}
        f_ = feats(p, x)
        out = cov_by_hand(q, f_, cp) @ p["net.2.weight"].T + p["net.2.bias"]
        fg = cov_by_hand(q, f_, cg)
        cos = F.normalize(fg) @ F.normalize(q["gce"]).T
        return F.cross_entropy(out, y) + F.cross_entropy(cos, y) + lam * torch.sqrt(((fg - frozen[y]) ** 2).sum())

    for _ in range(2):
        bodies, covs, gces = [], [], []
        for i in range(TRAIN):
            x, y = rows[i]
            cg, cp = conds(E if follow == "paper" else emb[i], shares[i])
            q = {**body, **heads[i], **cov, "gce": E}
            for _ in range(2):
                g = grad(q, x, y, lambda q, x, y: loss(q, x, y, E, cg, cp))
                q = {k: q[k] - lr * (g[k] + (mu * q[k] if k in cov or k == "gce" else 0)) for k in q}
            bodies.append({k: q[k] for k in body})
            covs.append({k: q[k] for k in cov})
            gces.append(q["gce"])
            heads[i] = {k: q[k] for k in HEAD}
        emb = gces + [E]  # pfllib: each client's next conditions from the GCE it holds now
        body, cov, E = mean(bodies), mean(covs), sum(gces) / TRAIN
    emb[TRAIN] = E  # the held-out client receives the global GCE
    x, y = rows[TRAIN]
    cp = conds(E, torch.bincount(y, minlength=K).double() / len(y))[1]
    h = heads[TRAIN]
    for _ in range(2):
        g = grad(h, x, y, lambda h, x, y: F.cross_entropy(
            cov_by_hand(cov, feats({**body, **h}, x), cp) @ h["net.2.weight"].T + h["net.2.bias"], y))
        h = step(h, g, lr)
    heads[TRAIN] = h
    close(state.params, body)
    close(state.extra["cov"], cov)
    torch.testing.assert_close(state.extra["gce"], E, **TOL)
    served, _ = algo.personalize(engine, state, EvalContext(data, torch.Generator(), 2, 1))
    for i in range(TRAIN + 1):
        close(state.clients.part, heads[i], i)
        want = conds(E if follow == "paper" else emb[i], shares[i])
        torch.testing.assert_close(served["cond"][i], want[1], **TOL)


# ----------------------------------------------------------------------------------------------
# FedCP: follow=paper (every client starts from the current global head and CPN) and pfllib (a
# client from the copies of the last round it took part in), one client a round so that they
# differ; the held-out client's head fitted through the frozen CPN and global head. The Gumbel noise
# (`FedCP.gumbel`, the one place it comes from) is set to 0 here, as the golden trace sets PFLlib's.
# ----------------------------------------------------------------------------------------------

def layer_norm(h, w, b):
    return (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5) * w + b


def cp_by_hand(cpn, f_, ctx, head, hg):
    d = f_.shape[-1]
    z = (f_ * ctx / ctx.norm()) @ cpn["fc.weight"].T + cpn["fc.bias"]
    gate = torch.softmax(torch.relu(layer_norm(z, cpn["ln.weight"], cpn["ln.bias"])).view(len(f_), 2, d), dim=1)
    return ((f_ * gate[:, 0]) @ head["net.2.weight"].T + head["net.2.bias"]
            + (f_ * gate[:, 1]) @ hg["weight"].T + hg["bias"])


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow, form", [("paper", "steps"), ("pfllib", "steps"), ("paper", "epochs")])
def test_fedcp_by_hand(engine_cls, follow, form):
    from fedrun.algorithms import FedCP
    from fedrun.simulate import _round_clients, round_generator

    lr, lam, rounds = 0.3, 0.5, 3
    algo = FedCP(lr=lr, lam=lam, local_epochs=2 if form == "epochs" else None, follow=follow, new_client_steps=2)
    algo.gumbel = lambda local, rnd, shape: torch.zeros(len(local.key), *shape, dtype=torch.float64)
    data, model, rows = problem()
    p0 = {k: v.detach().clone() for k, v in params_of(model).items()}
    engine = engine_cls(model)
    sched = Schedule(rounds=rounds, tau=2 if form == "steps" else 5, clients_per_round=1, batch_size=2,
                     sampling="steps")
    state, _ = simulate(algo, engine, data, params_of(model), sched, 0)
    state = onboard(algo, engine, state, data, 5)
    picked = [int(_round_clients(data, sched, round_generator(0, t))[0]) for t in range(1, rounds + 1)]
    assert picked == [1, 1, 0]  # (seed 0's draws: client 0 first trains in round 3, so the branches differ)

    start = algo.init_modules(p0, TRAIN + 1)  # the CPN's and the conditions' initial values (inputs)
    body = {k: v for k, v in p0.items() if k not in HEAD}
    heads = [{k: p0[k] for k in HEAD} for _ in range(TRAIN + 1)]
    hg = {"weight": p0["net.2.weight"], "bias": p0["net.2.bias"]}
    cpn, ctx = dict(start["cpn"]), list(start["ctx"])
    copies = [(dict(hg), dict(cpn)) for _ in range(TRAIN + 1)]  # pfllib: each client's own
    for i in picked:
        x, y = rows[i]
        my_hg, my_cpn = (hg, cpn) if follow == "paper" else copies[i]
        q = {**body, **heads[i], **{"c." + k: v for k, v in my_cpn.items()}}
        f0 = feats(q, x).detach()

        def loss(q, x, y):
            f_ = feats(q, x)
            out = cp_by_hand({k[2:]: q[k] for k in q if k.startswith("c.")}, f_, ctx[i], q, my_hg)
            return F.cross_entropy(out, y) + lam * mmd(f_, f0)
        for _ in range(2):
            q = step(q, grad(q, x, y, loss), lr)
        heads[i] = {k: q[k] for k in HEAD}
        body = {k: q[k] for k in body}
        hg = {k: 0.5 * q[f"net.2.{k}"] + 0.5 * my_hg[k] for k in ("weight", "bias")}
        cpn = {k[2:]: q[k] for k in q if k.startswith("c.")}
        ctx[i] = q["net.2.weight"].sum(0)
        copies[i] = (hg, cpn)
    copies[TRAIN] = (hg, cpn)  # the held-out client receives the global ones
    x, y = rows[TRAIN]
    h = heads[TRAIN]
    for _ in range(2):
        h = step(h, grad(h, x, y, lambda h, x, y: F.cross_entropy(
            cp_by_hand(cpn, feats({**body, **h}, x), ctx[TRAIN], h, hg), y)), lr)
    heads[TRAIN] = h
    close(state.params, body)
    served, _ = algo.personalize(engine, state, None)
    for i in range(TRAIN + 1):
        close(state.clients.part, heads[i], i)
        torch.testing.assert_close(served["ctx"][i], ctx[i], **TOL)
        want_hg, want_cpn = (hg, cpn) if follow == "paper" else copies[i]
        close({k[3:]: v for k, v in served.items() if k.startswith("hg.")}, want_hg, i)
        close({k[4:]: v for k, v in served.items() if k.startswith("cpn.")}, want_cpn, i)


# ----------------------------------------------------------------------------------------------
# onboarding of the simpler methods after one round: Local (its own SGD from the initial model),
# Ditto (its personal objective pulled to w^t), FedPer (its head, body frozen) and LG-FedAvg (its
# body, head frozen)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("name", ["local", "ditto", "fedper", "lgfedavg"])
def test_held_out_client_by_hand(engine_cls, name):
    from fedrun.algorithms import build

    lr, plr, lam = 0.3, 0.2, 0.7
    extra = dict(personal_lr=plr, lam=lam) if name == "ditto" else {}
    algo = build(name, lr=lr, new_client_steps=2, **extra)
    algo, state, engine, data, p0, rows = run(algo, engine_cls, rounds=1, tau=2)
    state = onboard(algo, engine, state, data, 5)
    trained = []
    for i in range(TRAIN):
        p = dict(p0)
        for _ in range(2):
            p = step(p, grad(p, *rows[i]), lr)
        trained.append(p)
    server = mean(trained)
    x, y = rows[TRAIN]
    if name == "local":
        p = dict(p0)
        for _ in range(2):
            p = step(p, grad(p, x, y), lr)
        close(state.clients.params, p, TRAIN)
    elif name == "ditto":
        v = dict(server)
        for _ in range(2):
            g = grad(v, x, y)
            v = step(v, {k: g[k] + lam * (v[k] - server[k]) for k in v}, plr)
        close(state.clients.personal, v, TRAIN)
    else:
        mine = HEAD if name == "fedper" else tuple(k for k in p0 if k not in HEAD)
        p = {k: p0[k] if k in mine else server[k] for k in p0}
        for _ in range(2):
            g = grad(p, x, y)
            p = {k: p[k] - lr * g[k] if k in mine else p[k] for k in p}
        close(state.clients.part, {k: p[k] for k in mine}, TRAIN)
        close(state.params, {k: server[k] for k in p0 if k not in mine})
