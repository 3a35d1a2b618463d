"""GPFL and FedPAC with BatchNorm models (issue 44, item 3), against PFLlib's clientGPFL / clientPAC
(d832e76) run client by client in torch: every trained step's forward is in train() (each client's batch
statistics, its running ones updated once per step), FedPAC's statistics and prototype passes in eval()
(no gradient, the running statistics read, not updated); the served models carry the declared
statistics (bn=averaged: the server's; bn=local: each client's own); vmap = loop."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_trainer_bodyhead import _body_params, _close, _head  # (a client's state against torch's module)

from fedrun.algorithms import build
from fedrun.algorithms.base import EvalContext, RunInfo, ServerState
from fedrun.algorithms.gpfl import conditions, cov_forward, gce_loss
from fedrun.algorithms.optim import PLAIN, local_optim
from fedrun.algorithms.personalize import onboarding_batches
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.tree import is_buffer, tree_flatten
from fedrun.models.small import MLPBN
from fedrun.simulate import Schedule, simulate

M, B, D, K, H = 3, 6, 5, 4, 7  # clients, rows per minibatch, features, classes, hidden width (the features)
OPT = {"momentum": 0.9, "weight_decay": 0.05}
LR = 0.1
# float32: each entry goes through 3 steps of a few dozen ops of magnitude <= ~10 (eps 1.2e-7): 1e-5 is
# ~10-100 eps of headroom for the differing summation orders of vmap's batched and torch's per-client kernels
TOL = 1e-5
STATS = ("net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked")
ENGINES = [VmapEngine, LoopEngine]


class MLPBNTwoPass(MLPBN):
    """MLPBN without features="both": FedPAC's aligned loss must still run ONE forward (PFLlib's
    head(base(x))), its logits the output layer applied to the features."""
    features_and_logits = False


def _model(cls=MLPBN) -> MLPBN:
    torch.manual_seed(0)
    return cls(D, K, hidden=[H])


def _batches(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(M, B, D, generator=g) * 2 + 1, torch.randint(0, K, (M, B), generator=g))
            for _ in range(steps)]


def _algo(name: str, optim, bn: str = "averaged", **kw):
    algo = build(name, **kw)
    return algo.bind(RunInfo(optim=PLAIN if optim == "plain" else local_optim(OPT, 3), bn=bn))


def _sgd(params, optim, weight_decay: float = 0.0) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=LR, **(OPT if optim != "plain" else {"weight_decay": weight_decay}))


def _data(sizes=(12, 12, 12, 8), holdout: int = 0, dtype=torch.float32) -> FederatedData:
    g = torch.Generator().manual_seed(5)
    s = torch.tensor(sizes)
    n = int(s.sum())
    x, y = torch.randn(n, D, generator=g, dtype=dtype) * 2 + 1, torch.randint(0, K, (n,), generator=g)
    xt, yt = torch.randn(n, D, generator=g, dtype=dtype) * 2 + 1, torch.randint(0, K, (n,), generator=g)
    return FederatedData("bn4b", ClientSplit.from_flat(x, y, s, 4), ClientSplit.from_flat(xt, yt, s, 4), K,
                         num_holdout=holdout)


def _ctx(data: FederatedData, seed: int = 3) -> EvalContext:
    return EvalContext(data=data, gen=torch.Generator().manual_seed(seed), batch_size=B, tau=2)


# -- GPFL ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("optim", ["plain", "momentum_wd"])
def test_gpfl_steps_are_pfllib_clientgpfl_in_train_mode(optim, engine_cls):
    """3 of GPFL's steps: clientGPFL.train's, the body's one forward in train() per step (its running
    statistics updated), the model's, the CoV's and the GCE's SGD optimizers (plain: the CoV and GCE with
    weight decay mu, as GPFL_opt / CoV_opt; momentum + weight decay: optim.*, mu = 0)."""
    mu = 0.1 if optim == "plain" else 0.0
    algo = _algo("gpfl", optim, lr=LR, lam=0.5, mu=mu)
    model = _model()
    local = algo.start_local(algo.init(params_of(model), M), torch.arange(M), 1)
    local = local._replace(counts=torch.tensor([[3., 1., 0., 2.], [0., 4., 4., 1.], [1., 1., 1., 1.]]))
    start = copy.deepcopy(local)
    engine = engine_cls(model)
    for x, y in _batches(3):
        local = algo.train_step(engine, local, [(x, y)], 1)
    cond_g, cond_p = conditions(start.emb, start.counts)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        cov = {k: v[c].clone().requires_grad_(True) for k, v in start.cov.items()}
        gce = start.gce["e"][c].clone().requires_grad_(True)
        opts = [_sgd(mine.parameters(), optim), _sgd(cov.values(), optim, mu), _sgd([gce], optim, mu)]
        for x, y in _batches(3):
            feat = mine(x[c], features=True)
            out = _head(mine)(cov_forward(cov, feat, cond_p[c]))
            feat_g = cov_forward(cov, feat, cond_g[c])
            loss = (F.cross_entropy(out, y[c]) + gce_loss(gce, feat_g, y[c])
                    + 0.5 * torch.linalg.norm(feat_g - start.frozen[c][y[c]]))
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
        _close(local.params, c, mine)
        assert (local.gce["e"][c] - gce).abs().max().item() < TOL
        for k, v in cov.items():
            assert (local.cov[k][c] - v).abs().max().item() < TOL, k


# -- FedPAC -------------------------------------------------------------------------------------------

def _pac_start(algo, model):
    """Round 1's Local, with global prototypes of every class (the alignment term on)."""
    state = algo.init(params_of(model), M)
    g = torch.Generator().manual_seed(2)
    state = ServerState(params=state.params, clients=state.clients,
                        extra={"protos": torch.randn(K, H, generator=g), "present": torch.ones(K, dtype=torch.bool)})
    return algo.start_local(state, torch.arange(M), 1)


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("model_cls", [MLPBN, MLPBNTwoPass])
@pytest.mark.parametrize("phases", [False, True])
@pytest.mark.parametrize("optim", ["plain", "momentum_wd"])
def test_fedpac_steps_are_pfllib_clientpac_in_train_mode(optim, phases, model_cls, engine_cls):
    """FedPAC: a head step (PFLlib's head epoch: the head's SGD, the body frozen), then 2 body steps
    (CE + lam * MSE to the global prototypes, the body's SGD, the head frozen), each ONE forward in
    train() (the running statistics updated once a step, with or without features="both"); the epochs
    form's head_step / body_step and the steps form's client_step (head_steps=1) alike."""
    algo = _algo("fedpac", optim, lr=LR, lam=0.5, head_steps=1, **({"local_epochs": 1} if phases else {}))
    model = _model(model_cls)
    local = _pac_start(algo, model)
    centers = local.centers[0]
    engine = engine_cls(model)
    steps = [algo.head_step, algo.body_step, algo.body_step] if phases else [algo.client_step] * 3
    for step, (x, y) in zip(steps, _batches(3)):
        local = step(engine, local, [(x, y)], 1)
    for c in range(M):
        mine = copy.deepcopy(model).train()
        head_opt, body_opt = _sgd(_head(mine).parameters(), optim), _sgd(_body_params(mine), optim)
        for s, (x, y) in enumerate(_batches(3)):
            rep = mine(x[c], features=True)
            loss = F.cross_entropy(_head(mine)(rep), y[c])
            if s:
                loss = loss + 0.5 * F.mse_loss(centers[y[c]], rep)
            mine.zero_grad()
            loss.backward()
            (body_opt if s else head_opt).step()
        _close(local.params, c, mine)


@pytest.mark.parametrize("engine_cls", ENGINES)
@pytest.mark.parametrize("pass_name", ["stats_step", "proto_step"])
def test_fedpac_feature_passes_run_in_eval_mode(pass_name, engine_cls):
    """FedPAC's statistics and prototype passes (no gradient; PFLlib's collect_protos under
    model.eval(), statistics_extraction from round 2 on): features of the client's model in eval() (its
    running statistics), which the pass leaves as they were."""
    algo = _algo("fedpac", "momentum_wd", lr=LR, head_steps=1, local_epochs=1)
    model = _model()
    engine = engine_cls(model)
    (x0, y0), (x, y) = _batches(2)
    local = algo.head_step(engine, _pac_start(algo, model), [(x0, y0)], 1)  # (statistics not the initial ones)
    out = getattr(algo, pass_name)(engine, local, [(x, y)], 1)
    prefix = "stat" if pass_name == "stats_step" else "proto"
    for k in STATS:
        assert torch.equal(out.params[k], local.params[k]), k
    for c in range(M):
        mine = copy.deepcopy(model)
        mine.load_state_dict({k: v[c] for k, v in local.params.items()})
        with torch.no_grad():
            feats = mine.eval()(x[c], features=True)
        onehot = F.one_hot(y[c], K).to(feats.dtype)
        assert (getattr(out, f"{prefix}_sum")[c] - onehot.T @ feats).abs().max().item() < TOL
        assert torch.equal(getattr(out, f"{prefix}_count")[c], onehot.sum(0))


# -- the server, serving, held-out clients (both methods) ---------------------------------------------

def _round(name: str, bn: str, holdout: int = 0):
    """One round of M clients (of M + holdout), 2 steps each, through start_local / end_round."""
    algo = _algo(name, "momentum_wd", bn, lr=LR, **({"mu": 0.0} if name == "gpfl" else {"head_steps": 1}))
    model = _model()
    before = algo.init(params_of(model), M + holdout)
    clients = torch.arange(M)
    local = algo.start_local(before, clients, 1)
    engine = VmapEngine(model)
    for x, y in _batches(2):
        local = algo.client_step(engine, local, [(x, y)], 1)
    return algo, model, engine, local, algo.end_round(before, local, clients, clients, None, M + holdout)


@pytest.mark.parametrize("name", ["gpfl", "fedpac"])
def test_served_models_carry_the_declared_statistics(name):
    """bn=averaged: the server's statistics are the round's clients' mean and every client's served
    model carries them; bn=local: each client keeps (and is served) its own, PFLlib's clients, whose
    server moves parameters only, the server's model carrying the first aggregated client's."""
    data = _data()
    algo, _, engine, local, state = _round(name, "averaged", holdout=1)
    served, _ = algo.personalize(engine, state, _ctx(data))
    for k in STATS[:2]:
        assert torch.allclose(state.params[k], local.params[k].mean(0), atol=1e-6, rtol=0), k
        assert all(torch.equal(served[k][c], state.params[k]) for c in range(M + 1)), k
    algo, model, engine, local, state = _round(name, "local", holdout=1)
    served, _ = algo.personalize(engine, state, _ctx(data))
    for k in STATS:
        assert torch.equal(state.params[k], local.params[k][0]), k
        assert torch.equal(served[k][:M], local.params[k]), k
        assert torch.equal(served[k][M], model.state_dict()[k]), k  # (not trained: the initial ones)


@pytest.mark.parametrize("name", ["gpfl", "fedpac"])
def test_held_out_client_keeps_its_statistics_under_bn_local(name):
    """bn=local: a held-out client's head fit runs in train() from its own (initial) statistics and it
    keeps them, as PFLlib's new clients fine-tune in train(): one step, one train-mode forward on its
    minibatch; bn=averaged: the served statistics stay the server's."""
    data = _data()
    for bn in ("local", "averaged"):
        algo, model, engine, _, state = _round(name, bn, holdout=1)
        algo.new_client_steps = 1
        new = torch.tensor([M])
        after = algo.onboard(engine, state, _ctx(data), new)
        if bn == "averaged":
            assert "bn_local" not in after.trainer
            continue
        (x, _), = onboarding_batches(_ctx(data), new, 1)[0]
        mine = copy.deepcopy(model)
        mine.load_state_dict({**{k: v for k, v in state.params.items() if not is_buffer(k)},
                              **{k: v[M] for k, v in state.trainer["bn_local"].items()}})
        with torch.no_grad():
            mine.train()(x[0])
        for k in STATS:
            v = mine.state_dict()[k]
            assert (after.trainer["bn_local"][k][M].double() - v.double()).abs().max().item() < TOL, k
            assert torch.equal(after.trainer["bn_local"][k][:M], state.trainer["bn_local"][k][:M]), k


@pytest.mark.parametrize("name,unit,bn", [("gpfl", "steps", "local"), ("gpfl", "epochs", "averaged"),
                                          ("fedpac", "epochs", "local"), ("fedpac", "steps", "averaged")])
def test_vmap_equals_loop_with_a_batchnorm_model(name, unit, bn):
    """A round of uneven clients (one held out) with MLPBN in float64 through simulate: the vmap and
    loop engines give the same server state, clients' state and metrics. (Minibatches of 4 rows drawn
    from 6 to 12: a minibatch of one row repeated, as 3 of a 6-row client's can be, has zero variance,
    its normalized features are rounding noise and the ReLU's sign after BatchNorm's zero bias follows
    it: the engines' batched and per-client kernels then differ, for every method, FedAvg's too.)"""
    def run(engine_cls):
        kw = {"mu": 0.0} if name == "gpfl" else {"head_steps": 1}
        algo = _algo(name, "momentum_wd", bn, lr=LR, **kw, **({"local_epochs": 1} if unit == "epochs" else {}))
        model = _model().double()
        data = _data((12, 8, 6, 6), holdout=1, dtype=torch.float64)
        return simulate(algo, engine_cls(model), data, params_of(model),
                        Schedule(rounds=1, tau=2, clients_per_round=3, batch_size=4), 0)

    (sv, lv), (sl, ll) = run(VmapEngine), run(LoopEngine)
    # float64: a round of a few hundred ops per number of magnitude <= ~10, eps64 1.1e-16: 1e-10 is ~1e4 x
    # above the rounding and far below a step's effect
    for k, v in sv.params.items():
        torch.testing.assert_close(v, sl.params[k], rtol=1e-10, atol=1e-10, msg=k)
    (vs, spec), (ls, spec_l) = tree_flatten(sv.clients), tree_flatten(sl.clients)
    assert spec == spec_l
    assert ("bn_local" in sv.trainer) == (bn == "local")
    for v, other in zip(vs, ls):
        torch.testing.assert_close(v, other, rtol=1e-10, atol=1e-10)
    for k, v in lv.row.items():
        if isinstance(v, float):  # (the vmap engine's per-client accuracies come as float32 ratios of counts,
            rel = 1e-6 if "_acc" in k else 1e-10  # ~1e-7 off a float64 model's: FedPer's too; 1e-6 is 8 eps32)
            assert v == pytest.approx(ll.row[k], rel=rel, abs=1e-10), k
