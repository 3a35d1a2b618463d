"""Algorithms and engines against hand-computed numbers on toy problems."""
import numpy as np
import pytest
import torch
from helpers import half_squared, quad_grad, quadratic_setup
from torch import nn

from fedrun.algorithms.base import ModelLocal, ServerState
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of, stack
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLR
from fedrun.simulate import Schedule, eval_context, simulate

ENGINES = [VmapEngine, LoopEngine]


def step(algo, engine, params, batches, rnd=1):
    """One local step of `algo` from stacked `params`; returns the new stacked params."""
    return algo.client_step(engine, ModelLocal(params=params), batches, rnd).params


@pytest.mark.parametrize("E", ENGINES)
def test_perfedavg_exact_on_quadratic_is_I_minus_alpha_H_times_g(E):
    model, params, batches = quadratic_setup()
    alpha, beta = 0.3, 0.1
    engine = E(model, criterion=half_squared)
    out = step(PerFedAvg(alpha=alpha, beta=beta, variant="exact"), engine, params, batches)
    (x1, y1), (x2, y2), (x3, y3) = batches
    for i in range(len(x1)):
        w = params["weight"][i, 0]
        w_tilde = w - alpha * quad_grad(w, x1[i], y1[i])
        g = quad_grad(w_tilde, x2[i], y2[i])
        H = x3[i].T @ x3[i] / len(y3[i])
        expected = w - beta * (torch.eye(len(w), dtype=w.dtype) - alpha * H) @ g
        torch.testing.assert_close(out["weight"][i, 0], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("E", ENGINES)
def test_perfedavg_hf_approaches_exact_as_delta_shrinks(E):
    torch.manual_seed(0)
    model = MLP(5, 3, hidden=[7], activation="tanh").double()  # smooth: O(delta^2) holds
    m, B = 4, 9
    params = stack(params_of(model), m)
    params = {k: v + 0.1 * torch.randn_like(v) for k, v in params.items()}
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(m, B, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (m, B), generator=g))
               for _ in range(3)]
    engine = E(model)
    exact = step(PerFedAvg(alpha=0.5, beta=1.0, variant="exact"), engine, params, batches)
    errors = []
    for delta in (1e-1, 1e-2, 1e-3):
        hf = step(PerFedAvg(alpha=0.5, beta=1.0, variant="hf", delta=delta), engine, params, batches)
        errors.append(max(float((hf[k] - exact[k]).abs().max()) for k in exact))
    # Central differences: error O(delta^2), so each 10x smaller delta cuts it by far more than 10x.
    assert errors[0] > 0
    assert errors[1] < errors[0] / 30 and errors[2] < errors[1] / 30, errors
    assert errors[2] < 1e-7


@pytest.mark.parametrize("variant", PerFedAvg.VARIANTS)
@pytest.mark.parametrize("E", ENGINES)
def test_perfedavg_with_alpha_zero_is_fedavg(E, variant):
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    m, B = 3, 8
    params = stack(params_of(model), m)
    x, y = torch.randn(m, B, 6), torch.randint(0, 4, (m, B))
    engine = E(model)
    fed = step(FedAvg(beta=0.1), engine, params, [(x, y)])
    per = step(PerFedAvg(alpha=0.0, beta=0.1, variant=variant), engine, params, [(x, y)] * 3)
    for k in params:
        torch.testing.assert_close(per[k], fed[k])
        assert not torch.equal(fed[k], params[k])


@pytest.mark.parametrize("E", ENGINES)
def test_fedavg_one_full_batch_step_is_one_centralized_gd_step(E):
    torch.manual_seed(0)
    C, n, d, K = 5, 12, 6, 3
    model = MLR(d, K)
    x, y = torch.randn(C, n, d), torch.randint(0, K, (C, n))
    beta = 0.5
    algo = FedAvg(beta=beta)
    w0 = params_of(model)
    local = algo.client_step(E(model), ModelLocal(params=stack(w0, C)), [(x, y)], 1)
    everyone = torch.arange(C)
    server = algo.server_update(ServerState(w0), local, everyone, everyone, None).params
    # centralized: one GD step on the pooled data (equal client sizes, so the means coincide)
    p = {k: v.clone().requires_grad_(True) for k, v in w0.items()}
    loss = nn.functional.cross_entropy(torch.func.functional_call(model, p, (x.reshape(-1, d),)), y.reshape(-1))
    grads = torch.autograd.grad(loss, list(p.values()))
    for (k, v), gk in zip(w0.items(), grads):
        torch.testing.assert_close(server[k], v - beta * gk)


def test_weighted_server_update_uses_normalized_weights():
    w = {"a": torch.tensor([[1.0], [5.0], [3.0]])}
    out = FedAvg().server_update(ServerState({"a": torch.zeros(1)}), ModelLocal(params=w), torch.arange(3),
                                 torch.tensor([0, 2]), torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(out.params["a"], torch.tensor([2.5]))  # client 1 trained, not aggregated


def test_bad_hyperparameters_raise_config_errors():
    with pytest.raises(ConfigError, match="algo.variant='second'.*fo, hf, exact"):
        PerFedAvg(variant="second")
    with pytest.raises(ConfigError, match="algo.beta"):
        FedAvg(beta=-1)


# ---------------------------------------------------------------- end to end on synthetic data

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return synthetic(num_clients=8, seed=3, cache_dir=str(tmp_path_factory.mktemp("cache")), chunk_len=64)


def _run(E, algo, data, personalize_batch=None, rounds=3, seed=0):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[20])
    rows = []
    sched = Schedule(rounds=rounds, tau=4, clients_per_round=4, batch_size=10, personalize_batch=personalize_batch)
    state, last = simulate(algo, E(model), data, params_of(model), sched, seed,
                           on_eval=lambda r, t, ev: rows.append(ev.row))
    return state, last, rows


def _perfedavg_fo():
    return PerFedAvg(alpha=0.05, beta=0.05, variant="fo")


# vmap vs loop, end to end for every algorithm: test_engines_agree.py


def test_same_seed_same_numbers_other_seed_other_numbers(small_data):
    _, _, a = _run(VmapEngine, _perfedavg_fo(), small_data)
    _, _, b = _run(VmapEngine, _perfedavg_fo(), small_data)
    _, _, c = _run(VmapEngine, _perfedavg_fo(), small_data, seed=1)
    assert a == b
    assert a != c


def test_evaluation_metrics_match_a_direct_computation(small_data):
    torch.manual_seed(0)
    model = MLR(small_data.in_features, small_data.num_classes)
    algo = PerFedAvg(alpha=0.1, beta=0.1)
    from fedrun.evaluate import evaluate

    sched = Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=1)
    ev = evaluate(algo, VmapEngine(model), ServerState(params_of(model)), small_data,
                  eval_context(small_data, sched, 0, 1))
    te, tr = small_data.test, small_data.train
    accs, pers_accs, correct = [], [], 0
    for c in range(small_data.num_clients):
        xt, yt = te.x[te.client_rows(c)], te.y[te.client_rows(c)]
        acc = float((model(xt).argmax(1) == yt).float().mean())
        accs.append(acc)
        correct += acc * len(yt)
        # one gradient step of lr alpha on this client's TRAINING rows only
        m2 = MLR(small_data.in_features, small_data.num_classes)
        m2.load_state_dict(model.state_dict())
        loss = nn.functional.cross_entropy(m2(tr.x[tr.client_rows(c)]), tr.y[tr.client_rows(c)])
        loss.backward()
        with torch.no_grad():
            for p in m2.parameters():
                p -= 0.1 * p.grad
        pers_accs.append(float((m2(xt).argmax(1) == yt).float().mean()))
    assert ev.row["global_acc"] == pytest.approx(correct / len(te.y), abs=1e-6)
    assert ev.row["global_acc_mean"] == pytest.approx(np.mean(accs), abs=1e-6)
    assert ev.row["global_acc_min"] == pytest.approx(min(accs), abs=1e-6)
    assert ev.row["pers_acc_mean"] == pytest.approx(np.mean(pers_accs), abs=1e-6)
    torch.testing.assert_close(ev.per_client["pers_acc"].double(), torch.tensor(pers_accs, dtype=torch.float64),
                               atol=1e-6, rtol=0)


def test_full_passes_in_small_groups_without_the_cached_view_give_the_same_numbers(small_data, monkeypatch):
    torch.manual_seed(0)
    model = MLP(small_data.in_features, small_data.num_classes, hidden=[20])
    w = params_of(model)
    per_client = stack(w, small_data.num_clients)
    per_client = {k: v + 0.01 * torch.randn_like(v) for k, v in per_client.items()}
    whole = VmapEngine(model)
    monkeypatch.setattr(VmapEngine, "CACHE_BYTES", 0)
    grouped = VmapEngine(model, max_chunks=3)
    assert len(small_data.train.chunk_idx) > 3
    for shared, p in ((True, w), (False, per_client)):
        ga, la = whole.full_grad(p, small_data.train, shared)
        gb, lb = grouped.full_grad(p, small_data.train, shared)
        torch.testing.assert_close(la, lb)
        for k in ga:
            torch.testing.assert_close(ga[k], gb[k])
        with torch.no_grad():
            torch.testing.assert_close(whole.evaluate(p, small_data.test, shared),
                                       grouped.evaluate(p, small_data.test, shared))
    assert grouped._chunk_x[id(small_data.train)][1] is None  # really took the uncached path


def test_a_cached_chunk_view_is_not_served_for_another_split_that_took_its_id(small_data):
    """The engine keeps small splits' chunk views by id(split); a freed split's id can come back as
    another split's: the view must be checked to be that split's own (here the reuse is staged)."""
    torch.manual_seed(0)
    model = MLP(small_data.in_features, small_data.num_classes, hidden=[20])
    w = stack(params_of(model), small_data.num_clients)
    a, b = small_data.train, small_data.test
    engine = VmapEngine(model)
    with torch.no_grad():
        engine.evaluate(w, a, False)  # caches a's view under id(a)
        engine._chunk_x[id(b)] = engine._chunk_x.pop(id(a))  # as if b had been given a's id after a was freed
        torch.testing.assert_close(engine.evaluate(w, b, False), VmapEngine(model).evaluate(w, b, False))


@pytest.mark.parametrize("make", [lambda: MLR(7, 3), lambda: MLP(7, 3, hidden=[5, 4], activation="elu")])
def test_stacked_forward_equals_vmapped_functional_call(make):
    torch.manual_seed(0)
    model = make()
    params = {k: v + 0.1 * torch.randn_like(v) for k, v in stack(params_of(model), 4).items()}
    x = torch.randn(4, 6, 7)
    direct = torch.func.vmap(lambda p, xb: torch.func.functional_call(model, p, (xb,)))(params, x)
    torch.testing.assert_close(model.stacked_forward(params, x), direct)


@pytest.mark.parametrize("make", [lambda: MLR(7, 3)] + [lambda a=a: MLP(7, 3, hidden=[5, 4], activation=a)
                                                       for a in ("relu", "elu", "tanh", "sigmoid")])
def test_hand_written_ce_gradient_equals_autograd(make):
    # the vmap engine's fast path (model.stacked_ce_grad) against the same engine through autograd
    torch.manual_seed(0)
    model = make().double()
    params = {k: v + 0.3 * torch.randn_like(v) for k, v in stack(params_of(model), 4).items()}
    x, y = torch.randn(4, 6, 7, dtype=torch.float64), torch.randint(0, 3, (4, 6))
    fast = VmapEngine(model)
    assert fast._hand(x)
    slow = VmapEngine(model, paths={"backward": "autograd"})
    (g1, l1), (g2, l2) = fast.grad(params, x, y), slow.grad(params, x, y)
    assert list(g1) == list(g2) == list(params)
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=1e-12)
    for k in params:
        torch.testing.assert_close(g1[k], g2[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: MLR(7, 3)] + [lambda a=a: MLP(7, 3, hidden=[5, 4], activation=a)
                                                       for a in ("relu", "elu", "tanh", "sigmoid")])
def test_hand_written_ce_gradient_with_one_model_and_row_weights_equals_autograd(make):
    # full passes: one model for every group of rows (shared), each row weighted (its chunk's mask)
    torch.manual_seed(0)
    model = make().double()
    params = {k: v + 0.3 * torch.randn_like(v) for k, v in params_of(model).items()}
    x, y = torch.randn(4, 6, 7, dtype=torch.float64), torch.randint(0, 3, (4, 6))
    weight = torch.rand(4, 6, dtype=torch.float64) * (torch.rand(4, 6) > 0.3)
    grads, losses = model.stacked_ce_grad(params, x, y, weight, shared=True)
    for i in range(4):
        p = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        logits = torch.func.functional_call(model, p, (x[i],))
        loss = (torch.nn.functional.cross_entropy(logits, y[i], reduction="none") * weight[i]).sum()
        expected = torch.autograd.grad(loss, list(p.values()))
        torch.testing.assert_close(losses[i], loss.detach(), rtol=1e-12, atol=1e-12)
        for k, g in zip(p, expected):
            torch.testing.assert_close(grads[k][i], g, rtol=1e-12, atol=1e-12)
        # the class-major logits of full passes with one model: the forward's, transposed
        torch.testing.assert_close(model.class_major_logits(params, x[i]), logits.detach().t(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("E", ENGINES)
def test_fedavg_without_test_time_update_evaluates_the_global_model_only(E, small_data):
    with_update = _run(E, FedAvg(beta=0.05, alpha=0.05), small_data)[2]
    global_only = _run(E, FedAvg(beta=0.05, alpha=None), small_data)[2]
    for a, b in zip(with_update, global_only):
        assert not any(k.startswith("pers_") for k in b)
        assert any(k.startswith("pers_") for k in a)
        # the same training and the same global model; train_loss from the forward-only pass
        assert {k: v for k, v in a.items() if not k.startswith("pers_") and k != "train_loss"} == \
            {k: v for k, v in b.items() if k != "train_loss"}
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)


def test_fedavg_alpha_accepts_null_and_names_it_in_errors():
    assert FedAvg(alpha=None).alpha is None
    with pytest.raises(ConfigError, match=r"algo.alpha='x' must be a number >= 0 or null"):
        FedAvg(alpha="x")
