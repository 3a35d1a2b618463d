"""pFedMe and the protocol options against hand-computed numbers on toy problems."""
import pytest
import torch
from helpers import group_options, half_squared, quadratic_setup
from omegaconf import OmegaConf

from fedrun.algorithms.base import ModelLocal, ServerState
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.algorithms.pfedme import PFedMe, PFedMeLocal
from fedrun.config import CONF_DIR
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of, stack
from fedrun.errors import ConfigError
from fedrun.models import MLP
from fedrun.run.protocol import apply_protocol
from fedrun.simulate import Schedule, eval_context, simulate

ENGINES = [VmapEngine, LoopEngine]


@pytest.mark.parametrize("mu", [0.0, 0.1])
@pytest.mark.parametrize("E", ENGINES)
def test_inner_solver_reaches_the_closed_form_prox_on_a_quadratic(E, mu):
    # f(theta) = 1/(2B) ||X theta - y||^2; argmin f + lam/2 ||theta - w||^2 + mu/2 ||theta||^2
    #   = (H + (lam + mu) I)^-1 (X^T y / B + lam w),  H = X^T X / B
    model, params, batches = quadratic_setup()
    lam = 2.0
    algo = PFedMe(lam=lam, eta=0.05, personal_lr=0.1, K=400, mu=mu)
    engine = E(model, criterion=half_squared)
    local = PFedMeLocal(params=params, theta={k: v.clone() for k, v in params.items()})
    out = algo.client_step(engine, local, batches[:1], 1)
    x, y = batches[0]
    for i in range(len(x)):
        w = params["weight"][i, 0]
        H = x[i].T @ x[i] / len(y[i])
        eye = torch.eye(len(w), dtype=w.dtype)
        theta = torch.linalg.solve(H + (lam + mu) * eye, x[i].T @ y[i] / len(y[i]) + lam * w)
        torch.testing.assert_close(out.theta["weight"][i, 0], theta, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(out.params["weight"][i, 0], w - 0.05 * lam * (w - theta), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("E", ENGINES)
def test_large_lam_and_K_approach_fedavg_local_steps(E):
    # theta = w - grad f(theta)/lam -> w - grad f(w)/lam, so w - eta*lam*(w - theta) -> w - eta*grad f(w).
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5], activation="tanh").double()
    m, B, tau, eta = 3, 8, 4, 0.1
    w0 = params_of(model)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(m, B, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (m, B), generator=g))
               for _ in range(tau)]
    engine = E(model)
    fed = ModelLocal(params=stack(w0, m))
    for b in batches:
        fed = FedAvg(beta=eta).client_step(engine, fed, [b], 1)
    gaps = []
    for lam in (10.0, 100.0, 1000.0):
        algo = PFedMe(lam=lam, eta=eta, personal_lr=0.5 / lam, K=60)
        local = algo.client_init(ServerState(w0), torch.arange(m), 1)
        for b in batches:
            local = algo.client_step(engine, local, [b], 1)
        gaps.append(max(float((local.params[k] - fed.params[k]).abs().max()) for k in w0))
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < gaps[0] / 50 and gaps[2] < 1e-4, gaps


@pytest.mark.parametrize("mu", [0.0, 0.001])
def test_local_step_is_the_formula_in_its_order_bitwise(mu):
    """The packed update does, per parameter entry, the float32 operations of the formula (and the
    authors' optimizer) in the same order: theta <- theta - lr ((((theta - w) lam) + g) + theta mu),
    then w <- w - (w - theta) eta lam; bit for bit, which the golden traces' tolerance would not see."""
    torch.manual_seed(0)
    model = MLP(7, 3, hidden=[5])
    w = {k: v + 0.1 * torch.randn_like(v) for k, v in stack(params_of(model), 4).items()}
    theta = {k: v + 0.1 * torch.randn_like(v) for k, v in w.items()}
    x, y = torch.randn(4, 6, 7), torch.randint(0, 3, (4, 6))
    algo = PFedMe(lam=15.0, eta=0.005, personal_lr=0.09, K=3, beta=1.0, mu=mu, personalized="local", train_all=False)
    engine = VmapEngine(model)
    out = algo.client_step(engine, PFedMeLocal(params=w, theta=theta), [(x, y)], 1)
    th = dict(theta)
    for _ in range(3):
        g, _ = engine.grad(th, x, y)
        step = {}
        for k in th:
            t = (th[k] - w[k]) * 15.0 + g[k]
            if mu:
                t = t + th[k] * mu
            step[k] = th[k] - t * 0.09
        th = step
    for k in w:
        assert torch.equal(out.theta[k], th[k])
        assert torch.equal(out.params[k], w[k] - (w[k] - th[k]) * (0.005 * 15.0))


def test_server_mixes_with_beta_and_aggregates_only_the_selected():
    algo = PFedMe(beta=2.0)
    w = {"a": torch.tensor([1.0])}
    local = PFedMeLocal(params={"a": torch.tensor([[3.0], [100.0], [5.0]])}, theta={"a": torch.zeros(3, 1)})
    out = algo.server_update(ServerState(w), local, torch.arange(3), torch.tensor([0, 2]), None)
    torch.testing.assert_close(out.params["a"], torch.tensor([(1 - 2) * 1.0 + 2 * 4.0]))
    out = algo.server_update(ServerState(w), local, torch.arange(3), torch.tensor([0, 2]), torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(out.params["a"], torch.tensor([-1.0 + 2 * 4.5]))


def test_bad_pfedme_options_name_the_option():
    with pytest.raises(ConfigError, match="algo.K=0 must be an integer >= 1"):
        PFedMe(K=0)
    with pytest.raises(ConfigError, match="algo.lam"):
        PFedMe(lam=-1)
    with pytest.raises(ConfigError, match="algo.personalized='best'.*theta, local"):
        PFedMe(personalized="best")
    with pytest.raises(ConfigError, match="algo.test_time='test'.*train, test_batches"):
        PerFedAvg(test_time="test")


# ------------------------------------------------------------ end to end, engines and protocol options

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic(num_clients=6, seed=2, cache_dir=str(tmp_path_factory.mktemp("cache")), chunk_len=64)


def _run(E, algo, data, rounds=3, aggregate="uniform", seed=0):
    torch.manual_seed(0)
    model = MLP(data.in_features, data.num_classes, hidden=[10])
    rows = []
    sched = Schedule(rounds=rounds, tau=3, clients_per_round=3, batch_size=8, aggregate=aggregate)
    state, last = simulate(algo, E(model), data, params_of(model), sched, seed, on_eval=lambda r, t,
                           ev: rows.append(ev.row))
    return state, rows


def _pfedme(**kw):
    return PFedMe(**{"lam": 15.0, "eta": 0.05, "personal_lr": 0.05, "K": 3, "beta": 1.5, **kw})


def _close(a, b):
    return all(a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5) for k in a)


def _global(row):
    return {k: v for k, v in row.items() if k.startswith("global") or k == "train_loss"}


def _pers(row):
    return {k: v for k, v in row.items() if k.startswith("pers")}


def test_train_all_changes_who_trains_not_the_global_model(data):
    s0, r0 = _run(VmapEngine, _pfedme(train_all=False), data)
    s1, r1 = _run(VmapEngine, _pfedme(train_all=True), data)
    # personalization helps
    assert r0[-1]["pers_acc"] > r0[-1]["global_acc"] and r1[-1]["pers_acc"] > r1[-1]["global_acc"]
    for k in s0.params:
        torch.testing.assert_close(s0.params[k], s1.params[k])
    assert [_global(r) for r in r0] == [_global(r) for r in r1]
    assert [_pers(r) for r in r0] != [_pers(r) for r in r1]


@pytest.mark.parametrize("train_all", [False, True])
def test_personalized_choice_changes_only_the_served_model(data, train_all):
    s0, r0 = _run(VmapEngine, _pfedme(train_all=train_all, personalized="theta"), data)
    s1, r1 = _run(VmapEngine, _pfedme(train_all=train_all, personalized="local"), data)
    assert [_global(r) for r in r0] == [_global(r) for r in r1]
    assert [_pers(r) for r in r0] != [_pers(r) for r in r1]


def test_mu_changes_training(data):
    _, r0 = _run(VmapEngine, _pfedme(mu=0.0), data)
    _, r1 = _run(VmapEngine, _pfedme(mu=0.5), data)
    assert r0[-1]["global_acc"] != r1[-1]["global_acc"] or r0[-1]["train_loss"] != r1[-1]["train_loss"]


def test_sample_weighted_aggregation_changes_only_the_weights(data):
    sizes = data.train.sizes
    assert len(set(sizes.tolist())) > 1
    _, ru = _run(VmapEngine, FedAvg(beta=0.05), data, aggregate="uniform")
    _, rs = _run(VmapEngine, FedAvg(beta=0.05), data, aggregate="samples")
    assert ru[0]["train_loss"] != rs[0]["train_loss"]
    # with equal client sizes the weights are uniform: the two must coincide
    even = synthetic(num_clients=4, seed=2, cache_dir=None, chunk_len=64)
    even.train.sizes = torch.full_like(even.train.sizes, int(even.train.sizes.min()))
    _, eu = _run(VmapEngine, FedAvg(beta=0.05), even, aggregate="uniform")
    _, es = _run(VmapEngine, FedAvg(beta=0.05), even, aggregate="samples")
    assert all(_close(a, b) for a, b in zip(eu, es))


def test_test_batch_personalization_reads_test_labels_and_train_does_not(data):
    shuffled = synthetic(num_clients=6, seed=2, cache_dir=None, chunk_len=64)
    g = torch.Generator().manual_seed(0)
    shuffled.test.y = shuffled.test.y[torch.randperm(len(shuffled.test.y), generator=g)]
    state, _ = _run(VmapEngine, PerFedAvg(alpha=0.3, beta=0.3), data, rounds=1)
    engine = VmapEngine(MLP(data.in_features, data.num_classes, hidden=[10]))
    sched = Schedule(rounds=1, tau=3, clients_per_round=3, batch_size=8)
    for test_time, reads_test in (("train", False), ("test_batches", True), ("test_then_train", True)):
        algo = PerFedAvg(alpha=0.3, beta=0.3, test_time=test_time)
        p0, _ = algo.personalize(engine, state, eval_context(data, sched, 0, 1))
        p1, _ = algo.personalize(engine, state, eval_context(shuffled, sched, 0, 1))
        same = all(torch.equal(p0[k], p1[k]) for k in p0)
        assert same != reads_test, test_time


def test_protocol_fills_only_null_options_that_exist():
    cfg = OmegaConf.create({"protocol": "official", "aggregate": None,
                            "algo": {"_target_": "fedrun.algorithms.pfedme.PFedMe", "mu": None, "personalized": "theta",
                                     "train_all": None}})
    used = apply_protocol(cfg)
    assert cfg.aggregate == "samples" and cfg.algo.mu == 0.001 and cfg.algo.train_all is True
    assert cfg.algo.personalized == "theta"  # explicit choice kept
    assert "algo.test_time" not in used and used["algo.personalized"] == "theta"
    honest = OmegaConf.create({"protocol": "honest", "aggregate": None,
                               "algo": {"_target_": "fedrun.algorithms.perfedavg.PerFedAvg", "test_time": None}})
    apply_protocol(honest)
    assert honest.aggregate == "uniform" and honest.algo.test_time == "train"
    with pytest.raises(ConfigError, match="protocol='fair'.*honest, official, official_2020"):
        apply_protocol(OmegaConf.create({"protocol": "fair"}))
    # algo.mu is pFedMe's (its inner problem's L2 term): FedProx's algo.mu, its proximal strength, is
    # left as given (null: FedProx refuses it in one line), while pFedMe's subclasses get it
    for target, filled in (("fedrun.algorithms.fedprox.FedProx", False), ("fedrun.algorithms.pfedme.PFedMe", True)):
        cfg = OmegaConf.create({"protocol": "official", "algo": {"_target_": target, "mu": None}})
        used = apply_protocol(cfg)
        assert (cfg.algo.mu == 0.001) == filled and ("algo.mu" in used) == filled, target


def test_official_2020_is_official_with_the_2020_perfedavg():
    from fedrun.algorithms import algorithm_class, names

    def resolved(protocol):  # every algorithm's declared choices, and the run's
        out = {}
        for name in names():
            cls = algorithm_class(name)
            cfg = OmegaConf.create({"protocol": protocol, "aggregate": None,
                                    "algo": {"_target_": f"{cls.__module__}.{cls.__qualname__}",
                                             **{k: None for k in cls.protocol}}})
            out.update({f"{name}:{k}": v for k, v in apply_protocol(cfg).items()})
        return out

    official, old = resolved("official"), resolved("official_2020")
    assert {k for k in official if official[k] != old[k]} == {"perfedavg:algo.test_time",
                                                              "perfedavg:algo.outer_step_from"}
    assert (old["perfedavg:algo.test_time"], old["perfedavg:algo.outer_step_from"]) == ("test_then_train", "w_tilde")
    assert official["perfedavg:algo.outer_step_from"] == resolved("honest")["perfedavg:algo.outer_step_from"] == "w"


# ------------------------------------------------------------------ Table 1 presets

TABLE1 = {  # (data, model): {algo: {option: value}} from the paper's Table 1 (fine-tuned)
    ("synthetic", "mlr"): {"fedavg": {"beta": 0.02, "alpha": None}, "perfedavg": {"alpha": 0.02, "beta": 0.002},
                           "pfedme": {"lam": 20}},
    ("synthetic", "dnn"): {"fedavg": {"beta": 0.03, "alpha": None}, "perfedavg": {"alpha": 0.01, "beta": 0.001},
                           "pfedme": {"lam": 30}},
    ("mnist", "mlr"): {"fedavg": {"beta": 0.02, "alpha": None}, "perfedavg": {"alpha": 0.03, "beta": 0.003},
                       "pfedme": {"lam": 15}},
    ("mnist", "dnn"): {"fedavg": {"beta": 0.02, "alpha": None}, "perfedavg": {"alpha": 0.02, "beta": 0.001},
                       "pfedme": {"lam": 30}},
}


def test_every_pfedme_preset_is_tested():
    names = [e for e in group_options("experiment") if e.startswith("pfedme_")]
    assert names == sorted(f"pfedme_{d}_{m}_{a}" for (d, m), algos in TABLE1.items() for a in algos)


@pytest.mark.parametrize("data,model,algo", [(d, m, a) for (d, m), algos in TABLE1.items() for a in algos])
def test_table1_presets_hold_the_papers_settings(data, model, algo):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment=pfedme_{data}_{model}_{algo}", "protocol=official"],
                      return_hydra_config=True)
    ch = cfg.hydra.runtime.choices
    assert (ch.algo, ch.data, ch.model) == (algo, "synthetic" if data == "synthetic" else "mnist_pfedme", model)
    assert (cfg.tau, cfg.batch_size, cfg.frac) == (20, 20, None)
    assert (cfg.rounds, cfg.clients_per_round) == ((600, 10) if data == "synthetic" else (800, 5))
    if model == "dnn":
        assert list(cfg.model.hidden) == [20 if data == "synthetic" else 100] and cfg.model.activation == "relu"
    for k, v in TABLE1[(data, model)][algo].items():
        assert cfg.algo[k] == v
    if algo == "pfedme":
        # personal lr: the authors' README's fine-tuned commands (the paper's Table 1 gives the synthetic column's 0.01)
        personal_lr = {"synthetic": 0.01, "mnist": {"dnn": 0.05, "mlr": 0.1}[model]}[data]
        assert (cfg.algo.K, cfg.algo.beta, cfg.algo.eta, cfg.algo.personal_lr) == (5, 2.0, 0.01, personal_lr)
    used = apply_protocol(cfg)
    a = instantiate(cfg.algo)
    assert cfg.aggregate == "samples"
    if algo == "pfedme":
        assert (a.train_all, a.mu, a.personalized) == (True, 0.001, "local") and used["algo.mu"] == 0.001
    if algo == "perfedavg":
        assert a.test_time == "test_batches" and a.variant == "fo"


def test_served_models_in_local_epochs_are_each_clients_passes_by_hand():
    """Without train_all, a client's PM is a local round computed at test time; with local_epochs=E
    that round is E passes over its own rows (floor(n_c / B) pFedMe steps a pass; the golden clients'
    2, 3, 4, 1 at B=5), not tau steps: recomputed one client at a time by client_step on the rows of
    round 0's evaluation stream (E blocks of the longest pass, a client taking the first of each)."""
    from test_golden_pfedme import golden_data

    data, E, B = golden_data(), 2, 5
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    engine, params = VmapEngine(model), params_of(model)
    algo = PFedMe(lr=0.05, personal_lr=0.05, lam=15.0, K=2, beta=1.0, train_all=False, local_epochs=E)
    sched = Schedule(rounds=1, tau=3, clients_per_round=4, batch_size=B)
    state = algo.init(params, data.num_clients)
    served, _ = algo.personalize(engine, state, eval_context(data, sched, 0, 0))
    per_pass = (data.train.sizes // B).tolist()
    L, C = max(per_pass), data.num_clients
    rows = data.train.shuffled_indices(torch.arange(C), E, L * B, eval_context(data, sched, 0, 0).gen)
    for c in range(C):
        local = algo.client_init(state, torch.tensor([c]), 0)
        for e in range(E):
            for s in range(per_pass[c]):
                local = algo.client_step(engine, local, [data.train.rows(rows[c:c + 1, e, s * B:(s + 1) * B])], 0)
        for k, v in local.theta.items():  # (personalized=theta, the default outside protocol=official)
            # float32, ~10 steps of K=2 inner steps each on values of magnitude ~1: ~100 eps32 (1.2e-7)
            torch.testing.assert_close(served[k][c], v[0], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("local_epochs", [None, 2])
def test_served_models_under_bn_local_start_from_each_clients_own_statistics(local_epochs):
    """Without train_all, bn=local: a client's PM computed at test time (tau steps, or local_epochs passes)
    starts from that client's own running statistics (`trainer["bn_local"]`): shifting client 0's changes its
    served statistics and leaves every other client's bit for bit."""
    from dataclasses import replace

    from test_golden_pfedme import golden_data

    from fedrun.models import MLPBN

    data = golden_data()
    torch.manual_seed(0)
    model = MLPBN(12, 4, hidden=[8])
    engine, params = VmapEngine(model), params_of(model)
    algo = PFedMe(lr=0.05, personal_lr=0.05, lam=15.0, K=2, beta=1.0, train_all=False, local_epochs=local_epochs)
    algo = algo.bind(replace(algo.run, bn="local"))
    sched = Schedule(rounds=1, tau=3, clients_per_round=4, batch_size=5)
    state = algo.init(params, data.num_clients)
    C = data.num_clients
    own = {k: torch.stack([v + c for c in range(C)]) for k, v in params.items() if k.endswith("running_mean")}
    assert own
    served = {}
    for shift in (0.0, 1.0):
        rows = {k: v.clone() for k, v in own.items()}
        for v in rows.values():
            v[0] += shift
        st = replace(state, trainer={**state.trainer, "bn_local": rows})
        served[shift], _ = algo.personalize(engine, st, eval_context(data, sched, 0, 0))
    for k in own:
        assert not torch.equal(served[0.0][k][0], served[1.0][k][0]), k
        assert torch.equal(served[0.0][k][1:], served[1.0][k][1:]), k
