"""The round's rates as tensors (fedrun.algorithms.rates), what lets compile=graphs replay one captured
round in every round: a step given a RoundRates computes, bit for bit, what it computes given the round
number, for every lr-decaying method and every schedule; the rate tensors are refilled in place for
each round; graph replays (the CPU stand-in of tests/test_acceleration.py) capture once per shape and
give eager's numbers over rounds whose lr changes; a step that reads its round otherwise runs eagerly."""
from __future__ import annotations

import pytest
import torch
from test_acceleration import _cpu_graph

from fedrun.algorithms import build, names, rates
from fedrun.algorithms.base import RunInfo, flat_clients
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.optim import LocalOptim
from fedrun.algorithms.rates import RoundNotCapturable, RoundRates, rate_step
from fedrun.config import group_file, load_conf
from fedrun.data import synthetic
from fedrun.engine import VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN
from fedrun.run.acceleration import LocalSteps
from fedrun.simulate import Schedule, local_training, sample_round, simulate

SCHED = Schedule(rounds=3, tau=2, clients_per_round=3, batch_size=4)
DECAYING = [n for n in names() if hasattr(build(n), "lr_decay")]  # DebiasedSGD's family
# the optimizers whose rate a schedule moves: SGD's fused multiply-add (with momentum: its buffer),
# Adam's float64 step size, AdamW's decoupled decay 1 - lr * wd
SCHEDULED = {"sgd_cosine_momentum": dict(momentum=0.9, schedule="cosine", t_max=10, lr_min=0.001),
             "adam_step": dict(name="adam", schedule="step", step_size=2, gamma=0.5),
             "adamw_exponential": dict(name="adamw", weight_decay=0.1, schedule="exponential", gamma=0.7)}


@pytest.fixture(scope="module")
def data():
    return synthetic(num_clients=8, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16, size_factor=1)


def _algo(name: str, optim: dict | None = None, **opts):
    if load_conf(group_file("algo", name)).get("inner_steps", 0) > 2:  # (MAML's unrolled steps: 2 suffice)
        opts = {**opts, "inner_steps": 2}
    algo = build(name, **opts)
    if optim:
        algo = algo.bind(RunInfo(optim=LocalOptim(**optim)))
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    try:
        algo.check_params(params_of(model))
    except ConfigError:  # FedBN needs BatchNorm
        torch.manual_seed(0)
        model = MLPBN(6, 3, hidden=[5])
    return algo, model


def _rounds_steps(data, algo, model, rnds: list):
    """The Locals after one round of local steps from the same start and rows, at each `rnds` (a round
    number, or a RoundRates set to a round)."""
    sched = SCHED
    algo = algo.bind(RunInfo.of(sched, data, algo.optim, algo.bn))
    state = algo.init(params_of(model), data.num_clients)
    _, trained, idx = sample_round(data, sched, algo.batches_per_step, 0, 1, algo.train_all)
    engine = VmapEngine(model)
    return [local_training(algo, engine, algo.start_local(state, trained, 1), data, idx,
                           r if isinstance(r, int) else r[0].at(r[1])) for r in rnds]


def _equal(a, b, where=""):
    if isinstance(a, tuple):  # a typed Local (a NamedTuple)
        a, b = a._asdict(), b._asdict()
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    else:
        assert torch.equal(a, b), where


OPTIMS = {**SCHEDULED, "momentum": dict(momentum=0.9)}  # (momentum: SGD's fused update of a decaying lr_decay rate)
CASES = ([(n, {"lr_decay": 0.5}, None) for n in DECAYING] + [("pfldyn", {"lr_decay": 0.5}, "momentum")]
         + [(n, {"lr_decay": 1.0} if n in DECAYING else {}, o) for n in names() for o in SCHEDULED
            if o != "adamw_exponential" or n in ("fedavg", "apple")])  # (AdamW: two weight decays in others)


@pytest.mark.parametrize("name,opts,optim", CASES, ids=[f"{n}-{'decay' if o else ''}-{p or ''}" for n, o, p in CASES])
def test_a_rate_tensor_gives_the_round_numbers_numbers(data, name, opts, optim):
    """Round 4's local steps given the round number, and given a RoundRates first used at round 1
    (its tensors made then, as a graph's warm-up makes them) and set to round 4, as a replay is:
    the same Local, bit for bit (parameters and optimizer state); round 1's differs."""
    optim = OPTIMS.get(optim)
    algo, model = _algo(name, optim, **opts)
    rates = RoundRates("cpu")
    first, fourth, replayed = _rounds_steps(data, algo, model, [1, 4, (rates, 1)])[:2] + \
        _rounds_steps(data, algo, model, [(rates, 4)])
    _equal(fourth, replayed)
    assert len(rates) >= 1  # the rate really came as a tensor
    p1, p4 = first.params, fourth.params
    assert any(not torch.equal(p1[k], p4[k]) for k in p1)


def test_scheduled_rates_of_two_base_lrs_are_two_tensors(data):
    """APPLE steps its core by lr and its mixing weights by dr_lr: under a schedule, two rates."""
    algo, model = _algo("apple", SCHEDULED["sgd_cosine_momentum"])
    assert algo.lr != algo.dr_lr
    rates = RoundRates("cpu")
    _rounds_steps(data, algo, model, [(rates, 3)])
    assert len(rates) == 2


def test_a_constant_rate_stays_a_float():
    assert LocalOptim(momentum=0.9).lr_at(0.1, RoundRates("cpu").at(5)) == 0.1
    assert build("pfldyn", lr_decay=1.0).lr_at(RoundRates("cpu").at(5)) == build("pfldyn").lr


def test_the_round_is_not_readable_but_through_its_rates():
    r = RoundRates("cpu").at(3)
    for read in (int, float, bool, lambda r: r - 1, lambda r: 2 ** r, lambda r: r == 3, lambda r: r <= 1,
                 lambda r: f"{r}"):
        with pytest.raises(RoundNotCapturable):
            read(r)
    with pytest.raises(TypeError):
        torch.full((2,), r)
    with pytest.raises(RoundNotCapturable, match="before RoundRates.at"):
        RoundRates("cpu").rate("lr", lambda t: 0.1)


def test_sgds_fused_update_takes_a_rate_tensor_where_addcmul_is_the_same_product(monkeypatch):
    """p.add(g, alpha=-lr) is one rounding of p - lr * g; addcmul(p, -rate, g) with the rate tensor is
    the same number (odd sizes: the vector loop and its tail), and where addcmul rounds otherwise (a
    stand-in that rounds the product first) the rate tensor is refused, so the step runs eagerly."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for n in (1, 7, 1003):
            p, g = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
            lr = 0.1 * 0.997 ** 41
            assert torch.equal(rate_step(p, g, torch.tensor(lr, dtype=torch.float64)), p.add(g, alpha=-lr))
    monkeypatch.setattr(rates, "_FUSED", {})
    monkeypatch.setattr(torch, "addcmul", lambda a, b, c, value=1: a + value * (b * c))
    with pytest.raises(RoundNotCapturable, match="fused multiply-add"):
        rate_step(torch.zeros(3), torch.ones(3), torch.tensor(0.1, dtype=torch.float64))


def _simulate(data, algo, model, steps, rounds=3):
    state, _ = simulate(algo, VmapEngine(model), data, params_of(model), SCHED.__class__(
        **{**SCHED.__dict__, "rounds": rounds}), 0, steps=steps)
    return state


@pytest.mark.parametrize("name,opts,optim", [("pfldyn", {"lr_decay": 0.5}, None), ("scaffold", {"lr_decay": 0.9}, None),
                                             ("fedavg", {}, "adamw_exponential"), ("fedphp", {}, None),
                                             ("apple", {}, None)])
def test_graphs_replay_one_capture_in_rounds_whose_rates_change(data, monkeypatch, name, opts, optim):
    """Three rounds of a decaying lr (or FedPHP's mu_t, APPLE's lam_t, set by client_init) under
    compile=graphs with the CPU stand-in of a graph: one capture, eager's numbers bit for bit."""
    _cpu_graph(monkeypatch)
    steps = LocalSteps("graphs")
    eager = _simulate(data, *_algo(name, OPTIMS.get(optim), **opts), None)
    graphed = _simulate(data, *_algo(name, OPTIMS.get(optim), **opts), steps)
    _equal(eager.params, graphed.params)
    # (APPLE's served theta, which its server_update mixes from the Local's cores outside the steps, is
    # 1 float32 ulp off on 1 of 8 clients, also before the rates: the graph's static copy of the cores is
    # contiguous where eager's is an expanded view, and the mix sums in another order)
    kept = lambda state: {k: v for k, v in flat_clients(state).items() if (name, k) != ("apple", "theta")}
    _equal(kept(eager), kept(graphed))
    assert steps.captures == 1 and steps._eager_why is None


class RoundReader(FedAvg):
    """FedAvg whose step decays its lr from the round number itself (not through per_round)."""

    def client_step(self, engine, local, batches, rnd):
        return self.sgd_step(engine, local, batches, self.beta * 0.5 ** (rnd - 1), rnd)


def test_a_step_reading_its_round_otherwise_runs_eagerly_and_says_so(data, monkeypatch, capsys):
    _cpu_graph(monkeypatch)
    steps = LocalSteps("graphs")
    model = MLP(6, 3, hidden=[5])
    eager = _simulate(data, RoundReader(), model, None)
    graphed = _simulate(data, RoundReader(), model, steps)
    _equal(eager.params, graphed.params)
    assert steps.captures == 0
    err = capsys.readouterr().err
    assert "local step changes with the round in a way one captured graph cannot replay" in err
    assert len([line for line in err.splitlines() if "compile=graphs" in line]) == 1

