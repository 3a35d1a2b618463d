"""The local trainer (issue 44) for FedALA, FedFomo, APPLE, FedCP, GPFL and FedPAC: each model (or
module) a client trains steps by `optim.*` as a torch.optim.SGD of its own (momentum, weight decay)
applied to the gradient the method's plain step takes (which the PFLlib golden traces pin), and the
BatchNorm statistics of FedALA's and FedFomo's models are torch's.

The gradient of a step is read off the plain step taken from the same Local: g = (p - p_plain) / lr,
in float64 (error ~ 1e-16 |p| / lr); the reference then applies torch's SGD update, momentum buffer
kept per slot by hand (buf = mom buf + g + wd p; p -= lr buf), so a step that skips the optimizer, a
wrong slot, rate or correction moves the result by O(lr |g|) >> the tolerance."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import build
from fedrun.algorithms.base import RunInfo
from fedrun.algorithms.fedfomo import weigh
from fedrun.algorithms.optim import local_optim
from fedrun.engine import VmapEngine, params_of
from fedrun.engine.tree import stack
from fedrun.models import MLP
from fedrun.models.small import MLPBN

MOM, WD = 0.9, 0.01
ATOL = 1e-11  # float64: ~1e-16 x |p| / lr per derived gradient, a few ops


def close(a, b, msg, atol=ATOL):
    """(torch.testing.assert_close's first call imports torch.distributed: seconds; a max suffices)"""
    assert a.shape == b.shape and a.dtype == b.dtype, msg
    d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert d <= atol, f"{msg}: max |d| = {d:.3e}"
D, K, B = 4, 3, 6


def _model(bn: bool = False):
    torch.manual_seed(0)
    return (MLPBN(D, K, hidden=[5]) if bn else MLP(D, K, hidden=[5])).double()


def _batches(m: int, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(m, B, D, generator=g, dtype=torch.float64), torch.randint(0, K, (m, B), generator=g))]
            for _ in range(n)]


def _get(local, path):
    v = getattr(local, path[0])
    return v if len(path) == 1 else v[path[1]]


def check_steps(algo, local, step, slots, n=2, wd=WD, others=()):
    """`n` calls of step(local, batches, s) under momentum + wd SGD against torch's update of the plain
    step's gradient. slots: {slot name: [(path, lr)]}, the entries each slot steps (path: (key, name) or
    (key,) of a tensor entry); `others`: paths that must stay unchanged."""
    opt = local_optim({"momentum": MOM, "weight_decay": wd}, 3)
    bufs = {}
    for s, batches in enumerate(_batches(len(next(iter(local.params.values()))), n)):
        plain = step(local, batches, s, algo.bind(RunInfo()))
        new = step(local, batches, s, algo.bind(RunInfo(optim=opt)))
        for slot, entries in slots.items():
            for path, lr in entries:
                p = _get(local, path)
                g = (p - _get(plain, path)) / lr
                d = g + wd * p
                buf = d if (slot, path) not in bufs else MOM * bufs[(slot, path)] + d
                bufs[(slot, path)] = buf
                close(_get(new, path), p - lr * buf, f"{slot} {path} step {s}")
        for path in others:
            close(_get(new, path), _get(local, path), f"{path} unchanged", atol=0)
        local = new
    return local


def _start(algo, params, m=2, clients=None):
    algo = algo.bind(replace(algo.run, optim=local_optim({"momentum": MOM, "weight_decay": WD}, 3)))
    state = algo.init(params, 4)
    return algo, algo.start_local(state, torch.arange(m) if clients is None else clients, 1)


def test_fedfomo_and_fedala_train_by_the_optimizer():
    model = _model()
    engine = VmapEngine(model)
    p = params_of(model)
    for name, opts in (("fedfomo", {}), ("fedala", dict(ala_steps=1))):
        algo = build(name, **opts)
        algo, local = _start(algo, p)
        check_steps(algo, local, lambda l, b, s, a: a.train_step(engine, l, b, 1),
                    {"opt": [(("params", k), algo.lr) for k in p]})


def test_fedfomo_local_epochs_is_its_training_phase():
    algo = build("fedfomo")
    algo.set_local_epochs(3)
    weigh_phase, train = algo.phases()
    assert (weigh_phase.steps, train.epochs, train.steps) == (1, 3, None)
    algo.set_local_epochs(None)
    algo = algo.bind(RunInfo(tau=4))
    assert algo.phases()[1].steps == 4


def test_apple_core_and_p_take_their_own_optimizers():
    model = _model()
    engine = VmapEngine(model)
    p = params_of(model)
    algo = build("apple", dr_lr=0.5)
    algo = algo.bind(RunInfo(train_sizes=torch.tensor([3, 5, 2])))  # 3 training clients of 4: column 3 held out
    algo, local = _start(algo, p)
    # (p's gradient reads the client's updated core, which the plain step moves elsewhere: the core here)
    check_steps(algo, local, lambda l, b, s, a: a.client_step(engine, l, b, 1),
                {"opt": [(("params", k), algo.lr) for k in p]})
    # p alone: a client without its own core in the mixture (a held-out one's steps)
    local = local._replace(own=torch.zeros_like(local.own))
    local = check_steps(algo, local, lambda l, b, s, a: a.client_step(engine, l, b, 1),
                        {"opt.p": [(("p",), algo.dr_lr)]})
    assert (local.p[:, 3] == 0).all() and (local.p[:, :3] != 1 / 3).all()


def test_fedcp_model_and_cpn_take_the_optimizer():
    model = _model()
    engine = VmapEngine(model)
    p = params_of(model)
    algo = build("fedcp", lr=0.1, lam=1.0)
    algo, local = _start(algo, p)
    check_steps(algo, local, lambda l, b, s, a: a.train_step(engine, l, b, 1),
                {"opt": [(("params", k), algo.lr) for k in p],
                 "opt.cpn": [(("cpn", k), algo.lr) for k in local.cpn]},
                others=[("head_g", "weight")])


def test_gpfl_model_cov_gce_take_the_optimizer_and_mu_with_weight_decay_is_refused():
    from fedrun.errors import ConfigError

    model = _model()
    engine = VmapEngine(model)
    p = params_of(model)
    algo = build("gpfl", lr=0.1, mu=0.0, lam=0.5)
    algo, local = _start(algo, p)
    local = local._replace(counts=torch.ones(2, K, dtype=torch.float64))
    check_steps(algo, local, lambda l, b, s, a: a.train_step(engine, l, b, 1),
                {"opt": [(("params", k), algo.lr) for k in p], "opt.cov": [(("cov", k), algo.lr) for k in local.cov],
                 "opt.gce": [(("gce", "e"), algo.lr)]})
    # mu (its CoV's and GCE's own weight decay, a gradient term of the plain step) with momentum, no wd
    algo = build("gpfl", lr=0.1, mu=0.3, lam=0.5)
    algo = algo.bind(replace(algo.run, optim=local_optim({"momentum": MOM}, 3)))
    local = algo.start_local(algo.init(p, 4), torch.arange(2), 1)._replace(counts=torch.ones(2, K, dtype=torch.float64))
    check_steps(algo, local, lambda l, b, s, a: a.train_step(engine, l, b, 1), {"opt.gce": [(("gce", "e"), algo.lr)]},
                wd=0.0)
    with pytest.raises(ConfigError, match="algo.mu=0.3 is the CoV's and GCE's weight decay"):
        algo = algo.bind(replace(algo.run, optim=local_optim({"weight_decay": 1e-3}, 3)))
def test_fedpac_head_then_body_each_by_its_optimizer():
    model = _model()
    engine = VmapEngine(model)
    p = params_of(model)
    algo = build("fedpac", lr=0.1, local_epochs=1)
    algo, local = _start(algo, p)
    head = [k for k in p if k.startswith("net.2")]
    body = [k for k in p if k not in head]
    assert head and set(algo.optim_slots(local)) == {"opt", "opt.head"}
    local = check_steps(algo, local, lambda l, b, s, a: a.head_step(engine, l, b, 1),
                        {"opt.head": [(("params", k), algo.lr) for k in head]}, others=[("params", k) for k in body])
    check_steps(algo, local, lambda l, b, s, a: a.body_step(engine, l, b, 1),
                {"opt": [(("params", k), algo.lr) for k in body]}, others=[("params", k) for k in head])


def test_every_method_of_the_group_takes_batchnorm_models():
    p = params_of(_model(bn=True))
    for name in ("fedala", "fedfomo", "apple", "fedcp", "gpfl", "fedpac"):
        build(name).check_params(p)


def test_fedfomo_fedala_batchnorm_statistics_are_torchs():
    """A training step of a BatchNorm model updates each client's running statistics as torch's
    nn.BatchNorm1d in train() on that client's minibatch, and its parameters as torch's SGD."""
    model = _model(bn=True)
    engine = VmapEngine(model)
    p = params_of(model)
    (x, y), = _batches(2, 1)[0]
    for name, opts in (("fedfomo", {}), ("fedala", dict(ala_steps=1))):
        algo = build(name, **opts)
        algo, local = _start(algo, p)
        out = algo.train_step(engine, local, [(x, y)], 1)
        for c in range(2):
            mine = copy.deepcopy(model).train()
            o = torch.optim.SGD(mine.parameters(), lr=algo.lr, momentum=MOM, weight_decay=WD)
            F.cross_entropy(mine(x[c]), y[c]).backward()
            o.step()
            for k, v in mine.state_dict().items():
                close(out.params[k][c], v, f"{name} {k}")


def test_fedfomo_weighs_parameters_and_keeps_each_clients_statistics():
    """The distance of w_n is over parameters only (running statistics moved far change no weight),
    and the mixture keeps the client's own running statistics (PFLlib mixes model.parameters())."""
    model = _model(bn=True)
    engine = VmapEngine(model)
    p = params_of(model)
    g = torch.Generator().manual_seed(3)
    own = {k: (v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype)) if v.is_floating_point() else v
           for k, v in stack(p, 2).items()}
    nbrs = {k: torch.stack([v + 0.2 * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point()
                            else v for _ in range(2)], 1) for k, v in own.items()}
    live = torch.ones(2, 2, dtype=torch.bool)
    batches = [b for b, in _batches(2, 1)]
    mixed, w = weigh(engine, own, own, nbrs, live, batches)
    far = {k: v * 100 if k.endswith("running_var") else v for k, v in nbrs.items()}
    _, w_far = weigh(engine, own, own, far, live, batches)
    close(w_far, w, "w", atol=0)
    for k in own:
        if "running" in k or "num_batches" in k:
            assert torch.equal(mixed[k], own[k]), k


def test_fedala_mixes_parameters_and_takes_the_servers_statistics():
    """FedALA on a BatchNorm model: W covers the last layer_idx PARAMETER tensors (layer_idx=0: every
    parameter, no running statistic), and a client's mixed model takes the server model's statistics
    (as its lower layers)."""
    p = params_of(_model(bn=True))
    algo = build("fedala", layer_idx=0)
    state = algo.init(p, 4)
    names = [k for k in p if "running" not in k and "num_batches" not in k]
    assert len(names) < len(p) and list(state.clients.weights) == names
    server = {k: v + 1 if v.is_floating_point() else v + 3 for k, v in p.items()}
    state = type(state)(params=server, extra=state.extra, clients=state.clients)
    local = algo.client_init(state, torch.tensor([0, 2]), 2)
    assert local.active.all()
    for k in p:
        if k not in names:
            assert torch.equal(local.params[k], server[k].expand_as(local.params[k])), k
