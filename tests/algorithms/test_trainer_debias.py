"""The debiased family (SCAFFOLD, FedDyn, PFLScaf, PFLDyn, P-Avg) on the local trainer: each client's
outer local step with optim.* is torch.optim's on that client's gradient of the method's objective
(its linear / proximal terms, clipped); a BatchNorm model's running statistics after a step are
torch's nn.BatchNorm's in train(); control variates and FedDyn's state cover the parameters only, the
buffers averaged as the parameters; the ambiguous option pairs are refused in one line."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedrun.algorithms import build
from fedrun.algorithms.adaptation import proto_cross_entropy
from fedrun.algorithms.base import RunInfo
from fedrun.algorithms.optim import local_optim
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.proto import class_means, proto_logits
from fedrun.engine.tree import param_names
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN

M, B, D, K = 3, 6, 4, 3  # clients training, rows per minibatch, features, classes
MW = {"momentum": 0.9, "weight_decay": 5e-4}
# float64 throughout: a few ops per step on numbers of order 1, two steps
TOL = dict(rtol=0, atol=1e-12)


def _batches(steps: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(M, B, D, generator=g, dtype=torch.float64), torch.randint(0, K, (M, B), generator=g))
             for _ in range(k)] for _ in range(steps)]


def _randn_like(tree: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in tree.items()}


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_momentum_step_with_batchnorm_is_torchs_per_client(name, engine_cls):
    """Two local steps of SCAFFOLD / FedDyn (nonzero c, c_i / g_i, clip, decayed lr) with momentum and
    weight decay on a BatchNorm MLP: client c's parameters AND running statistics are those of a torch
    model in train() whose loss gradient gets the method's terms, clip_grad_norm_, then torch.optim.SGD."""
    torch.manual_seed(0)
    model = MLPBN(D, K, hidden=[5]).double()
    p = params_of(model)
    algo = build(name, weight_decay=0.0, clip=0.5, lr_decay=0.9, lr=0.1)
    algo = algo.bind(replace(algo.run, optim=local_optim(MW, 3)))
    state = algo.init(p, 5)
    names = param_names(p)
    key = "c" if name == "scaffold" else "g"
    assert list(getattr(state.clients, key)) == names  # the method's state: parameters only
    clients = torch.tensor([0, 2, 4])
    trained = {k: p[k] for k in names}
    rows = {k: torch.stack([_randn_like(trained, 10 + c)[k] for c in range(5)]) for k in names}
    state = replace(state, clients=state.clients._replace(**{key: rows}))
    if name == "scaffold":
        state = replace(state, extra={"c": _randn_like(trained, 99)})
    rnd = 2
    local = algo.start_local(state, clients, rnd)
    batches = _batches(2, 1)
    engine = engine_cls(model)
    for b in batches:
        local = algo.client_step(engine, local, b, rnd)

    for i, c in enumerate(clients.tolist()):
        mine = copy.deepcopy(model).train()
        w0 = {k: v.detach().clone() for k, v in mine.named_parameters()}
        o = torch.optim.SGD(mine.parameters(), lr=0.1 * 0.9, **MW)
        for b in batches:
            x, y = b[0]
            o.zero_grad()
            F.cross_entropy(mine(x[i]), y[i]).backward()
            for k, v in mine.named_parameters():
                if name == "scaffold":
                    v.grad += state.extra["c"][k] - rows[k][c]
                else:
                    v.grad += -rows[k][c] + algo.alpha * (v.detach() - w0[k])
            torch.nn.utils.clip_grad_norm_(mine.parameters(), 0.5)
            o.step()
        for k, v in mine.state_dict().items():
            torch.testing.assert_close(local.params[k][i], v, **TOL, msg=f"{name} client {c} {k}")
        assert local.params["net.1.num_batches_tracked"][i].item() == 2


def test_pavg_proto_skips_the_unused_layer_as_torch_optim_does():
    """P-Avg (Proto) with momentum and optim.weight_decay on a BatchNorm MLP: the output layer, which
    the prototype loss does not use, is neither decayed nor moved (torch.optim skips a parameter
    without a gradient) and keeps no momentum; the others and the running statistics (two forwards
    in train(): support and query) are torch's on the same prototype loss."""
    torch.manual_seed(1)
    model = MLPBN(D, K, hidden=[5]).double()
    p = params_of(model)
    algo = build("pavg", adaptation="proto", weight_decay=0.0, clip=None, lr_decay=1.0, lr=0.1)
    algo = algo.bind(replace(algo.run, optim=local_optim(MW, 3)))
    state = algo.init(p, M)
    local = algo.start_local(state, torch.arange(M), 1)
    batches = _batches(2, 2, seed=3)
    engine = VmapEngine(model)
    for b in batches:
        local = algo.client_step(engine, local, b, 1)
    head = ["net.3.weight", "net.3.bias"]
    for k in head:
        assert torch.equal(local.params[k], p[k].expand_as(local.params[k]))
        assert not local.opt["opt"]["momentum"][k].any()
    for i in range(M):
        mine = copy.deepcopy(model).train()
        o = torch.optim.SGD(mine.parameters(), lr=0.1, **MW)
        for (xs, ys), (xq, yq) in batches:
            o.zero_grad()
            centers, present = class_means(mine(xs[i], features=True), ys[i], K)
            proto_cross_entropy(proto_logits(mine(xq[i], features=True), centers, present), yq[i], present).backward()
            assert all(dict(mine.named_parameters())[k].grad is None for k in head)
            o.step()
        for k, v in mine.state_dict().items():
            torch.testing.assert_close(local.params[k][i], v, **TOL, msg=f"client {i} {k}")


@pytest.mark.parametrize("name", ["scaffold", "pfldyn"])
def test_server_averages_buffers_and_keeps_state_over_parameters(name):
    """After a round on a BatchNorm model: the server's running statistics are the clients' mean
    (num_batches_tracked: an integer, the largest), c / h and c_i / g_i have parameter entries only,
    and eval_model=clients_mean serves a model state with an integer step counter."""
    torch.manual_seed(2)
    model = MLPBN(D, K, hidden=[5]).double()
    p = params_of(model)
    extra = {"adaptation": "proto"} if name == "pfldyn" else {}
    algo = build(name, eval_model="clients_mean", **extra)
    state = algo.init(p, 5)
    clients = torch.tensor([1, 2, 3])
    local = algo.start_local(state, clients, 1)
    local = local._replace(params={**local.params, "net.1.num_batches_tracked": torch.tensor([3, 5, 4])})
    for b in _batches(2, algo.batches_per_step):
        local = algo.client_step(VmapEngine(model), local, b, 1)
    new = algo.end_round(state, local, clients, torch.arange(M), None, 5)
    for k in ("net.1.running_mean", "net.1.running_var"):
        torch.testing.assert_close(new.params[k], local.params[k].mean(0), **TOL)
    # the largest (5) after 2 steps of one forward per minibatch (Proto: support and query)
    assert new.params["net.1.num_batches_tracked"].item() == 5 + 2 * algo.batches_per_step
    key = "c" if name == "scaffold" else "h"
    assert list(new.extra[key]) == param_names(p) == list(new.clients.c if name == "scaffold" else new.clients.g)
    assert any(new.extra[key][k].abs().sum() > 0 for k in new.extra[key])
    served = algo.eval_params(new)
    assert served["net.1.num_batches_tracked"].dtype == torch.long
    torch.testing.assert_close(served["net.1.running_mean"], new.clients.last["net.1.running_mean"].mean(0), **TOL)


def test_ambiguous_pairs_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^algo.weight_decay=0.001 and optim.weight_decay=0.0005 are both the "
                                          r"local step's weight decay \(algo=scaffold\); set one of them to 0$"):
        build("scaffold").check_run(RunInfo(optim=local_optim(MW, 3)))
    with pytest.raises(ConfigError, match=r"^algo.lr_decay=0.997 and optim.schedule=cosine both schedule the local lr"):
        build("feddyn", weight_decay=0.0).check_run(RunInfo(optim=local_optim({"schedule": "cosine"}, 3)))
    with pytest.raises(ConfigError, match=r"proto_first_step_only=true .* set optim.name=sgd"):
        build("pavg", adaptation="proto", proto_first_step_only=True).check_run(
            RunInfo(optim=local_optim({"name": "adam"}, 3)))
    with pytest.raises(ConfigError, match=r"^algo=pflscaf with algo.adaptation=maml does not handle BatchNorm"):
        build("pflscaf").check_params(params_of(MLPBN(D, K, hidden=[5])))
    build("pflscaf").check_params(params_of(MLP(D, K, hidden=[5])))
    build("pflscaf", adaptation="proto").check_params(params_of(MLPBN(D, K, hidden=[5])))
    for name in ("scaffold", "feddyn", "pavg", "pfldyn", "pflscaf"):  # what each takes
        adamw = local_optim({"name": "adamw", "weight_decay": 0.01, "schedule": "cosine"}, 3)
        build(name, weight_decay=0.0, lr_decay=1.0).check_run(RunInfo(optim=adamw))
        build(name).check_run(RunInfo(optim=local_optim({"momentum": 0.9}, 3)))
        refused = pytest.raises(ConfigError, build(name).check_run, RunInfo(optim=local_optim(MW, 3)))
        assert "\n" not in str(refused.value)
