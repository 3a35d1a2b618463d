"""FedBN and FedAvg on a model with BatchNorm, against plain nn.Module training written out here:
a client's step uses its minibatch's statistics and moves its running ones; FedBN keeps each
client's BatchNorm layers (affine parameters and running statistics) and averages the rest; FedAvg
averages the running statistics like the parameters. Algorithms that do not handle BatchNorm, and
FedBN on a model without it, are refused in one line."""
import copy

import pytest
import torch

from fedrun.algorithms import build, names
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.fedbn import FedBN
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.batchnorm import batchnorm_names, split_buffers
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN

ENGINES = [VmapEngine, LoopEngine]
LR, M, B = 0.3, 3, 5  # lr, clients, rows per minibatch


def setup(E, seed=0):
    torch.manual_seed(seed)
    model = MLPBN(4, 3, hidden=[6]).double()
    # feature shift
    x = torch.randn(2, M, B, 4, dtype=torch.float64) * torch.tensor([1.0, 3.0, 0.5]).view(1, M, 1, 1) + 1
    y = torch.randint(0, 3, (2, M, B))
    return model, E(model), params_of(model), x, y


def by_hand(model, state: dict, xs, ys) -> tuple[dict, dict]:
    """One client's steps with an nn.Module in training mode: (params, buffers) after them."""
    net = copy.deepcopy(model)
    net.load_state_dict(state)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in net.named_parameters()}, {k: v.detach() for k, v in net.named_buffers()}


def round_(algo, engine, state, x, y, clients):
    local = algo.client_init(state, clients, 1)
    for s in range(len(x)):
        local = algo.client_step(engine, local, [(x[s], y[s])], 1)
    return algo.server_update(state, local, clients, torch.arange(len(clients)), None)


@pytest.mark.parametrize("E", ENGINES)
def test_fedavg_averages_the_running_statistics_like_the_parameters(E):
    model, engine, init, x, y = setup(E)
    algo = FedAvg(beta=LR, alpha=None)
    state = round_(algo, engine, algo.init(init, M), x, y, torch.arange(M))
    hand = [by_hand(model, init, x[:, c], y[:, c]) for c in range(M)]
    for k, v in state.params.items():
        torch.testing.assert_close(v, torch.stack([h[0][k] for h in hand]).mean(0), rtol=1e-12, atol=1e-12)
    bufs = state.extra["buffers"]
    for k in ("net.1.running_mean", "net.1.running_var"):
        torch.testing.assert_close(bufs[k], torch.stack([h[1][k] for h in hand]).mean(0), rtol=1e-12, atol=1e-12)
    assert int(bufs["net.1.num_batches_tracked"]) == 2
    # the global model is scored in eval mode with those averaged statistics
    served = algo.eval_params(state)
    net = copy.deepcopy(model)
    net.load_state_dict(served)
    net.eval()
    torch.testing.assert_close(engine.logits(served, x[0, 0]), net(x[0, 0]))


@pytest.mark.parametrize("E", ENGINES)
def test_fedbn_keeps_every_clients_batchnorm_and_averages_the_rest(E):
    model, engine, init, x, y = setup(E)
    algo = FedBN(lr=LR)
    state = algo.init(init, M + 1)  # client 3 never trains
    bn = set(batchnorm_names(init))
    assert bn == {"net.1.weight", "net.1.bias", "net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"}
    state = round_(algo, engine, state, x, y, torch.arange(M))
    # round 2: each client starts from the server's shared layers and ITS OWN BatchNorm layers
    x2, y2 = x.flip(0) * 0.5, y.flip(0)
    own = [{**state.params, **state.extra["buffers"], **{k: v[c] for k, v in state.clients.bn.items()}}
           for c in range(M)]
    state2 = round_(algo, engine, state, x2, y2, torch.arange(M))
    hand = [by_hand(model, own[c], x2[:, c], y2[:, c]) for c in range(M)]
    for k in split_buffers(init)[0]:
        if k not in bn:  # shared: the mean
            torch.testing.assert_close(state2.params[k], torch.stack([h[0][k] for h in hand]).mean(0),
                                       rtol=1e-12, atol=1e-12)
    for c in range(M):
        for k in bn:  # local: the client's own, never averaged
            mine = {**hand[c][0], **hand[c][1]}[k]
            torch.testing.assert_close(state2.clients.bn[k][c], mine, rtol=1e-12, atol=1e-12)
    assert not torch.equal(state2.clients.bn["net.1.running_mean"][0], state2.clients.bn["net.1.running_mean"][1])
    for k in bn:  # the client that never trained keeps the initial BatchNorm layer
        assert torch.equal(state2.clients.bn[k][M], init[k])
    # served: shared layers + the client's own BatchNorm layer, in eval mode (its running statistics)
    served, _ = algo.personalize(engine, state2, None)
    net = copy.deepcopy(model)
    net.load_state_dict({k: v[1] for k, v in served.items()})
    net.eval()
    torch.testing.assert_close(engine.logits({k: v[1] for k, v in served.items()}, x[0, 1]), net(x[0, 1]))


def test_only_fedavg_and_fedbn_take_a_batchnorm_model_and_fedbn_needs_one():
    bn, plain = params_of(MLPBN(4, 3, hidden=[6])), params_of(MLP(4, 3, hidden=[6]))
    takes = []
    for name in names():
        algo = build(name, **({"alpha": None} if name == "fedavg" else {}))
        try:
            algo.check_params(bn)
            takes.append(name)
        except ConfigError as e:
            assert "\n" not in str(e) and f"algo={name}" in str(e) and "BatchNorm" in str(e)
    # (the methods ported to the local trainer take one: fedrun.algorithms.trainer; the others refuse in one line)
    assert {"fedavg", "fedbn", "perfedavg", "pfedme"} <= set(takes)
    with pytest.raises(ConfigError,
                       match="algo=fedbn keeps the model's BatchNorm layers local, but this model has none"):
        build("fedbn").check_params(plain)
    build("fedavg").check_params(bn)  # FedAvg + fine-tuning: training-mode steps (personalize.finetune)
