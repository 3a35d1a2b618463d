"""The honest protocol's personalized models, by value, against a hand computation with plain
autograd, one client at a time (engine-independent): FedAvg + update and Per-FedAvg (one step of lr
alpha from the server model on the client's training rows: all of them, or a minibatch), and
pFedMe's PM with train_all=false (tau local rounds from the server model on training minibatches:
K inner steps on theta, then the w step; theta served). Checking only that the honest options
differ from the official ones let a wrong lr or an extra local round pass."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedrun.algorithms.base import EvalContext
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.algorithms.pfedme import PFedMe
from fedrun.bench import agreement
from fedrun.engine import LoopEngine, VmapEngine, params_of


def _setup():
    data = agreement.data_of("mlp", torch.float64, "cpu")
    torch.manual_seed(0)
    model = agreement.MODELS["mlp"](data).double()
    return data, model, params_of(model)


def _grad(model, p, x, y):
    p = {k: v.detach().requires_grad_(True) for k, v in p.items()}
    loss = F.cross_entropy(functional_call(model, p, (x,)), y)
    return dict(zip(p, torch.autograd.grad(loss, list(p.values()))))


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("make", [lambda: FedAvg(beta=0.1, alpha=0.07),
                                  lambda: PerFedAvg(alpha=0.07, beta=0.1, variant="fo", delta=1e-3, test_time=None,
                                                    outer_step_from=None)], ids=["fedavg", "perfedavg"])
@pytest.mark.parametrize("batch", [None, 3])
def test_one_step_personalization_by_value(engine_cls, make, batch):
    data, model, w = _setup()
    algo = make()
    state = algo.init(w, data.num_clients)
    seed = 5
    ctx = EvalContext(data, torch.Generator().manual_seed(seed), 4, 2, batch)
    pers, _ = algo.personalize(engine_cls(model), state, ctx)
    if batch is not None:
        xb, yb = EvalContext(data, torch.Generator().manual_seed(seed), 4, 2, batch).train_batch()
    for c in range(data.num_clients):
        if batch is None:
            rows = data.train.client_rows(c)
            x, y = data.train.x[rows], data.train.y[rows]
        else:
            x, y = xb[c], yb[c]
        g = _grad(model, w, x, y)
        for k in w:
            torch.testing.assert_close(pers[k][c], w[k] - 0.07 * g[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
def test_pfedme_personalized_model_by_value(engine_cls):
    data, model, w = _setup()
    lam, eta, plr, K, tau = 15.0, 0.05, 0.03, 3, 2
    algo = PFedMe(lam=lam, eta=eta, personal_lr=plr, K=K, beta=1.0, mu=0.0, personalized="theta", train_all=False)
    state = algo.init(w, data.num_clients)
    ctx = EvalContext(data, torch.Generator().manual_seed(9), 4, tau, None)
    pers, _ = algo.personalize(engine_cls(model), state, ctx)
    xb, yb = EvalContext(data, torch.Generator().manual_seed(9), 4, tau, None).train_batch(4, steps=(tau,))
    for c in range(data.num_clients):
        wc = {k: v.clone() for k, v in w.items()}
        theta = {k: v.clone() for k, v in w.items()}
        for r in range(tau):
            for _ in range(K):
                g = _grad(model, theta, xb[c, r], yb[c, r])
                theta = {k: theta[k] - plr * (g[k] + lam * (theta[k] - wc[k])) for k in w}
            wc = {k: wc[k] - eta * lam * (wc[k] - theta[k]) for k in w}
        for k in w:
            torch.testing.assert_close(pers[k][c], theta[k], rtol=1e-10, atol=1e-12)
