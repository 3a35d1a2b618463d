"""The PFL baselines (FedProx, Local, fine-tuning, Ditto, APFL, FedPer, LG-FedAvg, FedRep, FedBABU)
against hand-computed numbers on toy problems, and their per-client state across a resume."""
import pytest
import torch

from fedrun.algorithms import FedAvg, FedProx
from fedrun.algorithms.base import ServerState, finetune
from fedrun.data import synthetic
from fedrun.functional import LoopEngine, VmapEngine, params_of, stack
from fedrun.models import MLP
from fedrun.simulate import Schedule, eval_context, simulate
from helpers import half_squared, quad_grad, quadratic_setup

ENGINES = [VmapEngine, LoopEngine]


@pytest.mark.parametrize("E", ENGINES)
def test_fedprox_two_steps_on_a_quadratic(E):
    model, params, batches = quadratic_setup()
    engine, beta, mu = E(model, criterion=half_squared), 0.1, 0.7
    algo = FedProx(beta=beta, mu=mu)
    w0 = params["weight"][:, 0]
    state = ServerState(params={"weight": params["weight"][0]})
    local = algo.client_init(state, torch.arange(3), 1)
    local["params"] = {"weight": params["weight"].clone()}  # per-client starting points (anchor: w^t = client 0's)
    local["anchor"] = {"weight": params["weight"][:1].expand_as(params["weight"])}
    for b in batches[:2]:
        local = algo.client_step(engine, local, [b], 1)
    for i in range(3):
        anchor = w0[0]
        w1 = w0[i] - beta * (quad_grad(w0[i], *[t[i] for t in batches[0]]) + mu * (w0[i] - anchor))
        w2 = w1 - beta * (quad_grad(w1, *[t[i] for t in batches[1]]) + mu * (w1 - anchor))
        torch.testing.assert_close(local["params"]["weight"][i, 0], w2, rtol=1e-12, atol=1e-12)


def tiny(num_clients=6, seed=1):
    return synthetic(num_clients=num_clients, dim=6, num_classes=4, seed=seed, cache_dir=None, chunk_len=16)


def run(algo, rounds=3, data=None, clients=3, tau=3, seed=0, start=None, on_checkpoint=None):
    data = data or tiny()
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    sched = Schedule(rounds=rounds, tau=tau, clients_per_round=clients, batch_size=5)
    evals = []
    state, last = simulate(algo, VmapEngine(model), data, params_of(model), sched, seed, start=start,
                           on_checkpoint=on_checkpoint, checkpoint_every=1 if on_checkpoint else 0,
                           on_eval=lambda r, t, ev: evals.append(ev))
    return state, last, evals, model, data


def test_fedprox_with_mu_zero_is_fedavg():
    a = run(FedProx(beta=0.1, alpha=0.1, mu=0.0))
    b = run(FedAvg(beta=0.1, alpha=0.1))
    for k in a[0].params:
        assert torch.equal(a[0].params[k], b[0].params[k])
    assert a[1].row == b[1].row
    c = run(FedProx(beta=0.1, alpha=0.1, mu=0.5))  # and the proximal term does act
    assert not torch.equal(c[0].params["net.0.weight"], a[0].params["net.0.weight"])


@pytest.mark.parametrize("E", ENGINES)
def test_finetune_steps_are_full_batch_gradient_steps(E):
    data = tiny()
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5]).double()
    data.train.x = data.train.x.double()
    engine, p = E(model), params_of(model)
    ctx = eval_context(data, Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=5), 0, 1)
    got, loss = finetune(engine, p, ctx, 0.3, 3)
    for c in range(data.num_clients):
        rows = data.train.client_rows(c)
        q = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        for s in range(3):
            out = torch.nn.functional.cross_entropy(torch.func.functional_call(model, q, (data.train.x[rows],)), data.train.y[rows])
            gr = torch.autograd.grad(out, list(q.values()))
            if s == 0:
                torch.testing.assert_close(loss[c], out.detach())
            q = {k: (v - 0.3 * g).detach().requires_grad_(True) for (k, v), g in zip(q.items(), gr)}
        for k in p:
            torch.testing.assert_close(got[k][c], q[k].detach(), rtol=1e-10, atol=1e-12)
    one, _ = finetune(engine, p, ctx, 0.3, 1)
    assert not torch.equal(one["net.0.weight"], got["net.0.weight"])