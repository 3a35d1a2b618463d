"""The local trainer (fedrun.algorithms.trainer) under Per-FedAvg, pFedMe, FedBN and FedAvg's BatchNorm
path, against nn.Module training written out here, one client at a time: the outer (meta) step of
Per-FedAvg and pFedMe's step along the Moreau envelope's gradient are torch.optim.SGD steps (momentum,
weight decay) on that gradient, the inner steps plain; every forward in training mode moves the
running statistics as a torch model in train() does; bn=local keeps each client's statistics between
its rounds, the server's model carrying the first aggregated client's; refusals are one line."""
import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms.base import RunInfo
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.fedbn import FedBN
from fedrun.algorithms.optim import local_optim
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.algorithms.pfedme import PFedMe
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.batchnorm import split_buffers
from fedrun.errors import ConfigError
from fedrun.models import MLPBN

ENGINES = [VmapEngine, LoopEngine]
M, B, S = 3, 5, 2  # clients, rows per minibatch, local steps
MOM, WD = 0.9, 5e-3
OPTIM = local_optim({"momentum": MOM, "weight_decay": WD}, 3)
# float64 throughout: a few hundred operations of magnitude ~1 each, eps 2.2e-16
TOL = dict(rtol=1e-12, atol=1e-12)


def setup(E, k=2, seed=0):
    torch.manual_seed(seed)
    model = MLPBN(4, 3, hidden=[6]).double()
    shift = torch.tensor([1.0, 3.0, 0.5]).view(1, 1, M, 1, 1)  # feature shift between clients
    x = torch.randn(S, k, M, B, 4, dtype=torch.float64) * shift + 1
    y = torch.randint(0, 3, (S, k, M, B))
    return model, E(model), params_of(model), x, y


def net_of(model, state):
    net = copy.deepcopy(model)
    net.load_state_dict(state)
    net.train()
    return net


def sgd_of(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=MOM, weight_decay=WD)


def assert_rows(got: dict, want: list[dict], c: int):
    for k, v in want[c].items():
        torch.testing.assert_close(got[k][c], v, **TOL)


def state_of(net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@pytest.mark.parametrize("E", ENGINES)
def test_perfedavg_outer_step_is_torch_sgd_momentum_on_the_meta_gradient_with_batchnorm(E):
    model, engine, init, x, y = setup(E)
    alpha, beta = 0.2, 0.3
    algo = PerFedAvg(alpha=alpha, beta=beta, variant="fo")
    algo = algo.bind(replace(algo.run, optim=OPTIM))
    local = algo.start_local(algo.init(init, M), torch.arange(M), 1)
    for s in range(S):
        local = algo.client_step(engine, local, [(x[s, 0], y[s, 0]), (x[s, 1], y[s, 1])], 1)
    want = []
    for c in range(M):
        net = net_of(model, init)
        opt = sgd_of(net.parameters(), beta)
        for s in range(S):
            w = [p.detach().clone() for p in net.parameters()]
            opt.zero_grad()
            F.cross_entropy(net(x[s, 0, c]), y[s, 0, c]).backward()
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(p.grad, alpha=-alpha)  # the inner step: plain SGD of alpha
            opt.zero_grad()
            F.cross_entropy(net(x[s, 1, c]), y[s, 1, c]).backward()
            with torch.no_grad():  # restore the parameters (PFLlib's clientperavg: not the buffers)
                for p, w0 in zip(net.parameters(), w):
                    p.copy_(w0)
            opt.step()
        want.append(state_of(net))
    for c in range(M):
        assert_rows(local.params, want, c)


def test_perfedavg_refusals_are_one_line():
    bn = params_of(MLPBN(4, 3, hidden=[6]))
    PerFedAvg(variant="hf").check_params(bn)
    with pytest.raises(ConfigError, match="algo=perfedavg does not handle BatchNorm.*algo.variant=exact") as e:
        PerFedAvg(variant="exact").check_params(bn)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("E", ENGINES)
def test_pfedme_envelope_step_is_torch_sgd_momentum_and_theta_moves_the_statistics(E):
    model, engine, init, x, y = setup(E, k=1)
    lam, eta, plr, K = 2.0, 0.1, 0.05, 3
    algo = PFedMe(lam=lam, eta=eta, personal_lr=plr, K=K, beta=1.0, mu=0.0)
    algo = algo.bind(replace(algo.run, optim=OPTIM))
    local = algo.start_local(algo.init(init, M), torch.arange(M), 1)
    for s in range(S):
        local = algo.client_step(engine, local, [(x[s, 0], y[s, 0])], 1)
    want_w, want_theta = [], []
    for c in range(M):
        net = net_of(model, init)  # theta's model
        w = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
        opt = sgd_of(w, eta)
        for s in range(S):
            for _ in range(K):  # the prox problem's solver: plain steps
                net.zero_grad()
                F.cross_entropy(net(x[s, 0, c]), y[s, 0, c]).backward()
                with torch.no_grad():
                    for p, wp in zip(net.parameters(), w):
                        p.sub_(plr * (p.grad + lam * (p - wp)))
            for p, wp in zip(net.parameters(), w):
                wp.grad = lam * (wp - p).detach()  # the Moreau envelope's gradient
            opt.step()
        theta = state_of(net)
        want_theta.append(theta)
        want_w.append({**theta, **{k: v.detach() for (k, _), v in zip(net.named_parameters(), w)}})
    for c in range(M):
        assert_rows(local.theta, want_theta, c)
        assert_rows(local.params, want_w, c)


def test_pfedme_server_mixes_parameters_with_beta_and_takes_the_mean_statistics():
    model, engine, init, x, y = setup(VmapEngine, k=1)
    algo = PFedMe(beta=2.0, K=1)
    state = algo.init(init, M)
    local = algo.start_local(state, torch.arange(M), 1)
    local = algo.client_step(engine, local, [(x[0, 0], y[0, 0])], 1)
    new = algo.server_update(state, local, torch.arange(M), torch.arange(M), None)
    for k, v in local.params.items():
        if k.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(new.params[k], v.mean(0), **TOL)
        elif k.endswith("num_batches_tracked"):
            assert torch.equal(new.params[k], v.max(0).values)
        else:
            torch.testing.assert_close(new.params[k], -init[k] + 2 * v.mean(0), **TOL)


def test_pfedme_bn_local_starts_theta_from_the_clients_own_statistics():
    model, engine, init, x, y = setup(VmapEngine, k=1)
    algo = PFedMe(K=1)
    algo = algo.bind(replace(algo.run, bn="local"))
    state = algo.init(init, M)
    everyone = torch.arange(M)
    local = algo.start_local(state, everyone, 1)
    local = algo.client_step(engine, local, [(x[0, 0], y[0, 0])], 1)
    state = algo.end_round(state, local, everyone, everyone, None, M)
    again = algo.start_local(state, torch.tensor([2]), 2)
    for k, v in split_buffers(local.params)[1].items():
        assert torch.equal(again.theta[k][0], v[2]) and torch.equal(again.params[k][0], v[2])
        if v.is_floating_point():
            assert not torch.equal(v[2], v[0])  # (feature-shifted clients: their own statistics differ)


@pytest.mark.parametrize("E", ENGINES)
def test_fedbn_steps_are_torch_sgd_momentum_per_client(E):
    model, engine, init, x, y = setup(E, k=1)
    lr = 0.3
    algo = FedBN(lr=lr)
    algo = algo.bind(replace(algo.run, optim=OPTIM))
    local = algo.start_local(algo.init(init, M), torch.arange(M), 1)
    for s in range(S):
        local = algo.client_step(engine, local, [(x[s, 0], y[s, 0])], 1)
    want = []
    for c in range(M):
        net = net_of(model, init)
        opt = sgd_of(net.parameters(), lr)
        for s in range(S):
            opt.zero_grad()
            F.cross_entropy(net(x[s, 0, c]), y[s, 0, c]).backward()
            opt.step()
        want.append(state_of(net))
    for c in range(M):
        assert_rows({**local.params, **local.buffers}, want, c)


def _round(algo, engine, state, clients, x, y):
    local = algo.start_local(state, clients, 1)
    for s in range(S):
        local = algo.client_step(engine, local, [(x[s, 0, clients], y[s, 0, clients])], 1)
    return local, algo.end_round(state, local, clients, torch.arange(len(clients)), None, M)


@pytest.mark.parametrize("algo", [FedAvg(beta=0.3, alpha=None), FedBN(lr=0.3)], ids=["fedavg", "fedbn"])
def test_bn_local_keeps_each_clients_statistics_and_the_server_the_first_aggregated(algo):
    model, engine, init, x, y = setup(VmapEngine, k=1)
    algo = copy.copy(algo)
    algo = algo.bind(replace(algo.run, bn="local"))
    state = algo.init(init, M)
    local1, state = _round(algo, engine, state, torch.tensor([0, 1]), x, y)
    local2, state = _round(algo, engine, state, torch.tensor([2, 1]), x, y)
    floats = [k for k, v in local1.buffers.items() if v.is_floating_point()]
    for k in floats:  # the server's model: the first aggregated client's (client 2)
        assert torch.equal(state.extra["buffers"][k], local2.buffers[k][0])
    back = algo.start_local(state, torch.tensor([0]), 3)  # client 0: its own, from round 1
    for k in floats:
        assert torch.equal(back.buffers[k][0], local1.buffers[k][0])
        assert not torch.equal(back.buffers[k][0], state.extra["buffers"][k])
    if isinstance(algo, FedBN):
        assert "bn_local" not in state.trainer  # (its own BatchNorm layers are kept once, in clients.bn)


def test_bn_policy_is_refused_in_one_line_for_a_bad_value():
    with pytest.raises(ConfigError) as e:
        FedAvg(beta=0.3, alpha=None).bind(RunInfo(bn="shared"))
    msg = str(e.value)
    assert "\n" not in msg and "bn" in msg and "averaged" in msg and "local" in msg and "shared" in msg


def test_bn_local_fine_tunes_each_client_from_its_own_statistics():
    from fedrun.algorithms.base import EvalContext
    from fedrun.algorithms.personalize import finetune
    from fedrun.data import synthetic
    from fedrun.engine.tree import stack

    data = synthetic(num_clients=M, dim=4, num_classes=3, seed=1, cache_dir=None, chunk_len=16)
    model, _, _, x, y = setup(VmapEngine, k=1)
    model, x = model.float(), x.float()  # (the synthetic rows are float32)
    engine, init = VmapEngine(model), params_of(model)
    algo = FedAvg(beta=0.3, alpha=0.1)
    algo = algo.bind(replace(algo.run, bn="local"))
    _, state = _round(algo, engine, algo.init(init, M), torch.tensor([1, 0, 2]), x, y)
    own = state.trainer["bn_local"]

    def ctx():
        return EvalContext(data=data, gen=torch.Generator().manual_seed(3), batch_size=B, tau=1, personalize_batch=B)

    served, _ = algo.personalize(engine, state, ctx())
    want, _ = finetune(engine, {**stack(algo.eval_params(state), M), **own}, ctx(), 0.1, 1, stacked=True)
    shared, _ = finetune(engine, algo.eval_params(state), ctx(), 0.1, 1)
    for k, v in want.items():
        assert torch.equal(served[k], v)
    assert not torch.equal(served["net.1.running_mean"][0], shared["net.1.running_mean"][0])
