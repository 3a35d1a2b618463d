"""BatchNorm models for APPLE and FedCP (issue 44, item 3), with PFLlib d832e76's policy for running
statistics (clientapple.py / clientcp.py):

- APPLE: the model that runs is the client's theta_i (PFLlib's `self.model`, whose `parameters()` the
  p-weighted mix of the cores overwrites before each step, its buffers untouched): its statistics are
  the client's own, moved by each step's training-mode forward and served with theta_i; the cores
  carry none, so bn=averaged and bn=local are the same run.
- FedCP: the trained model's body runs in training mode (its statistics move once a step); the frozen
  copy of the received body (the MMD term) runs in training mode too (batch statistics: PFLlib's
  Ensemble is in train()), its own statistics never read, so dropped; the body's statistics follow
  `bn` (averaged by the server, or each client's own, which is what it is served with, PFLlib's
  evaluation of `self.model`).

Every expected number comes from torch's nn.BatchNorm1d in train() / eval() (a deep copy of the model),
never from fedrun's own functions; float64 throughout."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import build
from fedrun.algorithms.base import EvalContext, RunInfo, flat_clients
from fedrun.algorithms.fedcp import cp_output, mmd
from fedrun.algorithms.optim import PLAIN, local_optim
from fedrun.algorithms.personalize import onboarding_batches
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.tree import is_buffer, param_names
from fedrun.models.small import MLPBN
from fedrun.simulate import Schedule, simulate

C, B, D, K = 4, 6, 4, 3  # clients (the last held out), rows a batch, features, classes
ENGINES = [VmapEngine, LoopEngine]
# float64; a step is a few dozen ops on numbers of size <= ~10 (BatchNorm's normalized activations,
# variances of unit-scale data): each rounds by eps64 ~ 1.1e-16 relative; 1e-12 is 1e3 x above that and
# far below any step's effect on the statistics (momentum 0.1 x a batch statistic ~ 1e-2)
TOL = dict(rtol=1e-12, atol=1e-12)


def _model():
    torch.manual_seed(0)
    return MLPBN(D, K, hidden=[5]).double()


def _noisy(tree, scale, seed):
    """Float entries moved by scale x N(0, 1) (running variances kept positive), integer ones + 3."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in tree.items():
        if not v.is_floating_point():
            out[k] = v + 3
        elif k.endswith("running_var"):
            out[k] = v * (1 + scale * torch.rand(v.shape, generator=g, dtype=v.dtype))
        else:
            out[k] = v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype)
    return out


def _batch(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    return 1.5 * torch.randn(m, B, D, generator=g, dtype=torch.float64) + 0.5, torch.randint(0, K, (m, B), generator=g)


def _torch_stats(model, state, x):
    """The state_dict of torch's model loaded with `state` after one train() forward of x."""
    mine = copy.deepcopy(model)
    mine.load_state_dict(state)
    mine.train()
    mine(x)
    return mine.state_dict()


def _row(tree, c):
    return {k: v[c] for k, v in tree.items()}


def _assert_stats(got, want, what):
    for k, v in want.items():
        if k.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(got[k], v, **TOL, msg=f"{what}: {k}")
        elif k.endswith("num_batches_tracked"):
            assert torch.equal(got[k], v), f"{what}: {k}"


# -- APPLE ----------------------------------------------------------------------------------------------

def _apple(follow="paper", bn="averaged", optim=None):
    algo = build("apple", dr_lr=0.5, follow=follow)
    algo = algo.bind(RunInfo(train_sizes=torch.tensor([3, 5, 2]), bn=bn,  # 3 training clients of 4: 3 held out
                             optim=PLAIN if optim is None else local_optim(optim, 3)))
    model = _model()
    state = algo.init(params_of(model), C)
    # cores apart, p off uniform, every client's statistics its own
    state.clients = state.clients._replace(
        params=_noisy(state.clients.params, 0.3, 2), theta=_noisy(state.clients.theta, 0.5, 3),
        p={"p": state.clients.p["p"] + 0.05 * torch.arange(C, dtype=torch.float64) * (
            state.extra["member"].to(torch.float64))})
    return algo, model, state


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("follow", ["paper", "pfllib"])
def test_apple_step_moves_each_clients_own_statistics_as_torch_train(engine_cls, follow):
    """One APPLE step on a BatchNorm model: client c's running statistics are those of torch's model
    in train() holding the mixture theta_c = sum_j p_cj c_j (its own core as it trains) and the
    client's OWN statistics, after one forward of its batch; the cores carry none."""
    algo, model, state = _apple(follow, optim=dict(momentum=0.9, weight_decay=0.01))
    engine = engine_cls(model)
    clients = torch.tensor([2, 0])
    local = algo.start_local(state, clients, 1)
    before = copy.deepcopy(local)
    x, y = _batch(len(clients))
    out = algo.client_step(engine, local, [(x, y)], 1)
    assert not any(is_buffer(k) for k in out.params) and not any(is_buffer(k) for k in state.clients.params)
    for i, c in enumerate(clients.tolist()):
        p = before.p[i]
        mixed = {k: sum(p[j] * (before.params[k][i] if j == c else state.clients.params[k][j]) for j in range(C))
                 for k in param_names(params_of(model))}
        own = {k: v[c] for k, v in state.clients.theta.items() if is_buffer(k)}
        want = _torch_stats(model, {**mixed, **own}, x[i])
        _assert_stats(_row(out.theta, i), want, f"client {c}")


@pytest.mark.parametrize("follow", ["paper", "pfllib"])
def test_apple_serves_theta_with_the_clients_own_statistics_under_either_bn(follow):
    """After a round: each trained client's served theta carries the statistics of its own steps, an
    untrained client's (and the held-out client's) are as they were, and bn=local is the same state
    as bn=averaged (no statistics on any shared model, no `bn_local`)."""
    engine = VmapEngine(_model())
    ends = {}
    for bn in ("averaged", "local"):
        algo, model, state = _apple(follow, bn)
        clients = torch.tensor([2, 0])
        local = algo.start_local(state, clients, 1)
        for s in range(2):
            x, y = _batch(len(clients), seed=10 + s)
            local = algo.client_step(engine, local, [(x, y)], 1)
        end = algo.end_round(state, local, clients, torch.arange(len(clients)), None, C)
        served, _ = algo.personalize(engine, end, None)
        assert "bn_local" not in end.trainer
        for k, v in served.items():
            if is_buffer(k):
                assert torch.equal(v[clients], local.theta[k]), k
                assert torch.equal(v[[1, 3]], state.clients.theta[k][[1, 3]]), k
        ends[bn] = (end, served)
    (a, sa), (b, sb) = ends["averaged"], ends["local"]
    for key in a.clients._fields:
        for k in getattr(a.clients, key):
            assert torch.equal(getattr(a.clients, key)[k], getattr(b.clients, key)[k]), (key, k)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_apple_held_out_client_starts_from_its_statistics_and_its_onboarding_moves_them():
    """A held-out client's served theta: the mixture p0 . cores (its first step's) with the statistics
    of torch's model in train() after one forward of its onboarding minibatch, from its own (the
    initial model's); over tau steps, one update a step."""
    algo, model, state = _apple()
    engine = VmapEngine(model)
    data = _data(holdout=True)
    new = torch.tensor([C - 1])
    ctx = lambda: EvalContext(data, torch.Generator().manual_seed(5), 2, 3)  # noqa: E731 (tau 3)
    stats = {k: v[C - 1] for k, v in state.clients.theta.items() if is_buffer(k)}
    served, _ = algo.personalize(engine, algo.onboard(engine, state, ctx(), new), None)
    for k, v in stats.items():
        if k.endswith("num_batches_tracked"):
            assert torch.equal(served[k][C - 1], v + 3), k
    algo.new_client_steps = 1
    served, _ = algo.personalize(engine, algo.onboard(engine, state, ctx(), new), None)
    (x, _), = onboarding_batches(ctx(), new, 1)[0]
    p0 = state.extra["p0"]
    mixed = {k: sum(p0[j] * state.clients.params[k][j] for j in range(C)) for k in state.clients.params}
    _assert_stats(_row(served, C - 1), _torch_stats(model, {**mixed, **stats}, x[0]), "held out")


# -- FedCP ------------------------------------------------------------------------------------------------

def _fedcp(bn="averaged"):
    algo = build("fedcp", lr=0.1, lam=1.0).bind(RunInfo(bn=bn))
    model = _model()
    state = algo.init(params_of(model), C)
    return algo, model, state


@pytest.mark.parametrize("engine_cls", ENGINES)
def test_fedcp_step_is_pfllibs_ensemble_in_train_mode(engine_cls):
    """One plain FedCP step on a BatchNorm model equals PFLlib's clientCP step written in torch: the
    client's model and the frozen copy of the received body both in train() (batch statistics), the
    loss CE(head_p(f p) + head_g(f g)) + lam MMD(f, f0), SGD of lr on the model: the new parameters and
    the model's running statistics (one forward's update); the frozen copy's stay as they were."""
    algo, model, state = _fedcp()
    engine = engine_cls(model)
    clients = torch.tensor([2, 0])
    local = algo.start_local(state, clients, 1)
    local = local._replace(params=_noisy(local.params, 0.2, 4))  # (the model apart from the received body)
    before = copy.deepcopy(local)
    x, y = _batch(len(clients))
    d = local.ctx.shape[-1]
    noise = algo.gumbel(local, 1, (B, 2, d))
    out = algo.train_step(engine, local, [(x, y)], 1)
    head = ("net.3.weight", "net.3.bias")
    for i in range(len(clients)):
        mine, base = copy.deepcopy(model).train(), copy.deepcopy(model).train()
        mine.load_state_dict(_row(before.params, i))
        base.load_state_dict({**_row(before.params, i), **_row(before.frozen, i)})
        rep = mine(x[i], features=True)
        hg = _row(before.head_g, i)
        out_i = cp_output(_row(before.cpn, i), rep, before.ctx[i], noise[i],
                          (mine.net[3].weight, mine.net[3].bias), (hg["weight"], hg["bias"]))
        rep_base = base(x[i], features=True).detach()
        loss = F.cross_entropy(out_i, y[i]) + 1.0 * mmd(rep, rep_base)
        loss.backward()
        with torch.no_grad():
            for prm in mine.parameters():
                prm -= 0.1 * prm.grad
        want = mine.state_dict()
        for k, v in want.items():
            if v.is_floating_point():
                torch.testing.assert_close(out.params[k][i], v, **TOL, msg=f"client {i}: {k}")
            else:
                assert torch.equal(out.params[k][i], v), k
        assert set(head) <= set(want)
    for k, v in before.frozen.items():
        assert torch.equal(out.frozen[k], v), k


def _fedcp_round(bn, engine=None):
    algo, model, state = _fedcp(bn)
    engine = engine or VmapEngine(model)
    clients = torch.tensor([2, 0])
    local = algo.start_local(state, clients, 1)
    x, y = _batch(len(clients))
    local = algo.train_step(engine, local, [(x, y)], 1)
    end = algo.end_round(state, local, clients, torch.arange(len(clients)), None, C)
    return algo, engine, model, state, clients, local, end


def test_fedcp_serves_the_averaged_or_each_clients_own_statistics():
    """bn=averaged: every client is served the body with the trained clients' statistics averaged (the
    counter: the largest), the server's; bn=local: each client its own (a trained client's from its
    step, the others' the initial model's) and the server's model carries the first aggregated client's."""
    algo, engine, model, state, clients, local, end = _fedcp_round("averaged")
    served, _ = algo.personalize(engine, end, None)
    stats = [k for k in state.params if is_buffer(k)]
    assert stats and "bn_local" not in end.clients._fields
    for k in stats:
        v = local.params[k]
        want = v.mean(0) if v.is_floating_point() else v.max(0).values
        torch.testing.assert_close(end.params[k], want, **TOL)
        for c in range(C):
            assert torch.equal(served[k][c], end.params[k]), (k, c)
    algo, engine, model, state, clients, local, end = _fedcp_round("local")
    served, _ = algo.personalize(engine, end, None)
    for k in stats:
        for i, c in enumerate(clients.tolist()):
            assert torch.equal(served[k][c], local.params[k][i]), (k, c)
        for c in (1, 3):
            assert torch.equal(served[k][c], state.params[k]), (k, c)
        assert torch.equal(end.params[k], local.params[k][0]), k
    # (what is served is scored with those statistics: eval() of torch's model)
    split = _data(holdout=True).test
    loss, _ = algo.score(engine, served, split)
    rows = split.client_rows(2)
    mine = copy.deepcopy(model).eval()
    mine.load_state_dict({k: served[k][2] for k in state.params})
    feat = mine(split.x[rows], features=True)
    two = _row(served, 2)
    out = cp_output({k[4:]: v for k, v in two.items() if k.startswith("cpn.")}, feat, two["ctx"], None,
                    (two["net.3.weight"], two["net.3.bias"]), (two["hg.weight"], two["hg.bias"]))
    torch.testing.assert_close(loss[2], F.cross_entropy(out, split.y[rows], reduction="sum"), **TOL)


@pytest.mark.parametrize("bn", ["averaged", "local"])
def test_fedcp_held_out_client_fits_in_train_mode_and_keeps_its_statistics_under_bn_local(bn):
    """A held-out client's onboarding step runs its body in training mode: under bn=local its own
    statistics (the initial model's) move as torch's train() forward on its minibatch moves them and it
    is served those; under bn=averaged it is served the server's."""
    algo, engine, model, state, clients, local, end = _fedcp_round(bn)
    algo.new_client_steps = 1
    data = _data(holdout=True)
    new = torch.tensor([C - 1])
    ctx = lambda: EvalContext(data, torch.Generator().manual_seed(5), 2, 3)  # noqa: E731
    out = algo.onboard(engine, end, ctx(), new)
    served, _ = algo.personalize(engine, out, None)
    (x, _), = onboarding_batches(ctx(), new, 1)[0]
    stats = [k for k in state.params if is_buffer(k)]
    if bn == "averaged":
        for k in stats:
            assert torch.equal(served[k][C - 1], end.params[k]), k
        return
    body = {k: v for k, v in end.params.items() if not k.startswith("net.3")}
    want = _torch_stats(model, {**body, **{k: end.params[k] for k in ("net.3.weight", "net.3.bias")},
                                **{k: end.trainer["bn_local"][k][C - 1] for k in stats}}, x[0])
    _assert_stats(_row(served, C - 1), want, "held out")
    assert not torch.equal(served[stats[0]][C - 1], end.trainer["bn_local"][stats[0]][C - 1])


# -- the tiny federated problem (simulate: vmap = loop) ------------------------------------------------

def _data(holdout=False):
    g = torch.Generator().manual_seed(7)
    sizes = torch.tensor([8, 6, 7] + ([5] if holdout else []))
    n = int(sizes.sum())
    x = 1.5 * torch.randn(n, D, generator=g, dtype=torch.float64) + 0.5
    y = torch.randint(0, K, (n,), generator=g)
    xt = torch.randn(n, D, generator=g, dtype=torch.float64)
    return FederatedData("bn4", ClientSplit.from_flat(x, y, sizes, 4), ClientSplit.from_flat(xt, y.clone(), sizes, 4),
                         K, num_holdout=1 if holdout else 0)


def _simulate(algo, engine_cls, rounds=2, holdout=True):
    model = _model()
    sched = Schedule(rounds=rounds, tau=2, clients_per_round=2, batch_size=3)
    return simulate(algo, engine_cls(model), _data(holdout), params_of(model), sched, 0)


def _assert_states_close(a, b, what):
    for k, v in a.params.items():
        torch.testing.assert_close(v, b.params[k], **TOL, msg=f"{what}: server {k}")
    ca, cb = flat_clients(a), flat_clients(b)
    assert ca.keys() == cb.keys(), what
    for key, tree in ca.items():
        if isinstance(tree, dict):
            for k, v in tree.items():
                torch.testing.assert_close(v, cb[key][k], **TOL, msg=f"{what}: clients.{key}.{k}")


@pytest.mark.parametrize("name", ["apple", "fedcp"])
@pytest.mark.parametrize("bn", ["averaged", "local"])
def test_vmap_equals_loop_with_a_batchnorm_model(name, bn):
    """Two rounds of 2 of 3 training clients (and a held-out one) on an MLP with BatchNorm: the same
    server and per-client state (statistics included) and metrics on both engines."""
    runs = []
    for engine_cls in ENGINES:
        algo = build(name, **({"dr_lr": 0.5} if name == "apple" else {"lr": 0.1, "lam": 1.0}))
        algo = algo.bind(RunInfo(bn=bn))
        state, last = _simulate(algo, engine_cls)
        runs.append((state, last.row))
    (sv, rv), (sl, rl) = runs
    _assert_states_close(sv, sl, f"{name} bn={bn}")
    for k, v in rv.items():  # (the vmap engine's served-model scores come back rounded to float32, as for
        # FedAvg's: ratios of counts, 1 rounding of eps32 ~ 1.2e-7 relative)
        if isinstance(v, float):
            assert v == pytest.approx(rl[k], rel=4e-7, abs=1e-12), k
    stats = [k for k in (sv.clients.theta if name == "apple" else sv.params) if k.endswith("running_mean")]
    assert stats
