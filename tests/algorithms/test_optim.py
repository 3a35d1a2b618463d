"""The local optimizer (fedrun.algorithms.optim, `optim.*`): every client's update is torch.optim's
(SGD with momentum / Nesterov / weight decay, Adam, AdamW) run on that client alone, its state carried
over rounds (persist) or not (restart) and its learning rate torch.optim.lr_scheduler's; the options
are checked in one line and algorithms whose step is not plain gradient descent refuse them."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import algorithm_class, build, names
from fedrun.algorithms.base import RunInfo
from fedrun.algorithms.optim import LocalOptim, canonical, local_optim
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP
from fedrun.simulate import Schedule, round_draws, simulate

C = 8  # clients; every one trains every round, so each is one torch optimizer's run
SCHED = Schedule(rounds=3, tau=3, clients_per_round=C, batch_size=5)


@pytest.fixture(scope="module")
def data():
    return synthetic(num_clients=C, dim=6, num_classes=3, seed=1, cache_dir=None, chunk_len=16)


def _torch_optim(opt: LocalOptim, params, lr: float) -> torch.optim.Optimizer:
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, nesterov=opt.nesterov,
                               weight_decay=opt.weight_decay)
    cls = torch.optim.Adam if opt.name == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)


def _torch_schedule(opt: LocalOptim, o: torch.optim.Optimizer):
    s = opt.schedule
    if s == "step":
        return torch.optim.lr_scheduler.StepLR(o, opt.step_size, opt.gamma)
    if s == "exponential":
        return torch.optim.lr_scheduler.ExponentialLR(o, opt.gamma)
    if s == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(o, opt.t_max, opt.lr_min)
    return None


OPTIMS = {
    "momentum": dict(momentum=0.9),
    "nesterov_wd_restart": dict(momentum=0.8, nesterov=True, weight_decay=0.01, state="restart"),
    "wd_step": dict(weight_decay=5e-3, schedule="step", step_size=2, gamma=0.5),
    "adam_cosine": dict(name="adam", schedule="cosine", lr_min=0.001),
    "adamw_exp": dict(name="adamw", weight_decay=0.1, schedule="exponential", gamma=0.7, state="restart"),
}


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("case", list(OPTIMS))
def test_each_client_trains_as_a_torch_optimizer_on_its_own(data, case, engine_cls):
    """algo=local with every client training every round: client c's model after 3 rounds x 3 steps is
    torch.optim's on c's minibatches (one optimizer for the run with state=persist, a new one each
    round with restart), its lr torch's scheduler stepped once a round."""
    opt = local_optim(OPTIMS[case], SCHED.rounds)
    lr = 0.05
    algo = build("local", lr=lr)
    algo = algo.bind(replace(algo.run, optim=opt))
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    state, _ = simulate(algo, engine_cls(model), data, params_of(model), SCHED, seed=0)

    worst = 0.0
    for c in range(C):
        mine = copy.deepcopy(model)
        o = _torch_optim(opt, mine.parameters(), lr)
        clock = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)  # the round's lr, from torch's scheduler
        sched = _torch_schedule(opt, clock)
        for rnd in range(1, SCHED.rounds + 1):
            if opt.state == "restart":
                o = _torch_optim(opt, mine.parameters(), lr)
            for g in o.param_groups:
                g["lr"] = clock.param_groups[0]["lr"]
            _, trained, idx, _ = round_draws(algo, data, SCHED, 0, rnd)
            assert trained.tolist() == list(range(C))
            for s in range(SCHED.tau):
                x, y = data.train.rows(idx[c, s, 0])
                o.zero_grad()
                F.cross_entropy(mine(x), y).backward()
                o.step()
            if sched is not None:
                clock.step()
                sched.step()
        for k, v in mine.named_parameters():
            worst = max(worst, (state.clients.params[k][c] - v.detach()).abs().max().item())
    print(f"{case} {engine_cls.name}: max |fedrun - torch.optim| = {worst:.2e}")
    assert worst < 2e-6, worst


def test_the_schedules_are_torchs():
    """lr_at over 12 rounds against torch.optim.lr_scheduler stepped once a round."""
    for opts in (dict(schedule="step", step_size=3, gamma=0.5), dict(schedule="exponential", gamma=0.9),
                 dict(schedule="cosine", t_max=10, lr_min=0.01)):
        opt = LocalOptim(**opts)
        o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
        sched = _torch_schedule(opt, o)
        for rnd in range(1, 13):
            assert opt.lr_at(0.3, rnd) == pytest.approx(o.param_groups[0]["lr"], rel=1e-12, abs=1e-15), (opts, rnd)
            o.step()
            sched.step()


def test_defaults_change_no_number(data):
    """optim's defaults run the same op as before (exact), and a scheduled run says its step reads the round."""
    torch.manual_seed(0)
    model = MLP(6, 3, hidden=[5])
    a, _ = simulate(build("fedavg"), VmapEngine(model), data, params_of(model), SCHED, seed=0)
    algo = build("fedavg")
    algo = algo.bind(replace(algo.run, optim=local_optim({"momentum": 0.0, "schedule": "constant"}, 3)))
    b, _ = simulate(algo, VmapEngine(model), data, params_of(model), SCHED, seed=0)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params) and "opt" not in b.clients
    assert not algo.step_uses_round
    algo = algo.bind(replace(algo.run, optim=local_optim({"schedule": "cosine"}, 3)))
    assert algo.step_uses_round


def test_options_are_checked_in_one_line():
    for given, words in [({"name": "rmsprop"}, r"optim.name='rmsprop' is not allowed; choose one of: sgd, adam, adamw"),
                         ({"momentum": 1.5}, r"optim.momentum=1.5 must be a number in \[0, 1\)"),
                         ({"nesterov": True}, r"optim.nesterov=true needs optim.name=sgd and optim.momentum > 0"),
                         ({"schedule": "linear"}, r"optim.schedule='linear' is not allowed"),
                         ({"state": "keep"}, r"optim.state='keep' is not allowed; choose one of: persist, restart"),
                         ({"lr": 0.1}, r"optim.lr is not an option"),
                         ({"betas": [0.9]}, r"optim.betas=\[0.9\] must be two numbers")]:
        with pytest.raises(ConfigError, match=words):
            local_optim(given, 10)
    refusing = build("pfedme")
    refusing.optim_ok, refusing.optim_why = False, "its reason"  # (a method not on the local trainer)
    with pytest.raises(ConfigError, match=r"algo=pfedme takes only optim.\* defaults .*: its reason$"):
        refusing = refusing.bind(replace(refusing.run, optim=local_optim({"momentum": 0.9}, 10)))
    refusing.bind(RunInfo(optim=local_optim({}, 10)))  # the defaults: every algorithm
    # the algorithms that take optim.* (those ported to the local trainer, fedrun.algorithms.trainer)
    assert {"fedavg", "fedper", "lgfedavg", "local", "perfedavg", "pfedme", "fedbn"} <= \
        {n for n in names() if algorithm_class(n).optim_ok}


def test_the_fingerprint_keeps_only_what_changes_the_numbers():
    """Plain SGD drops the node (runs from before it resume); cosine's t_max null is the run's rounds."""
    plain = {"rounds": 5, "optim": {"name": "sgd", "momentum": 0.0, "gamma": 0.3}}
    assert canonical(plain) == {"rounds": 5}
    cos = canonical({"rounds": 5, "optim": {"name": "sgd", "momentum": 0.9, "schedule": "cosine"}})
    assert cos["optim"] == {"name": "sgd", "momentum": 0.9, "nesterov": False, "weight_decay": 0.0, "state": "persist",
                            "schedule": "cosine", "lr_min": 0.0, "t_max": 5}
    assert canonical(cos) == cos
