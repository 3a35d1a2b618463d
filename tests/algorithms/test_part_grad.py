"""A part-only gradient (`Engine.grad` / `train_grad` / `state_grad` `wrt`, `LocalTrainer.grad`): FedRep's head
phase (epochs) and FedPAC's head step differentiate the head alone, the body (upstream of it, frozen) taken as
a constant. Their update is bit for bit the full gradient's update of the head (every parameter, BatchNorm's
running statistics and the optimizer state), on both engines and every convolution path; the body's backward
is not run (no convolution backward in a head step)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedrun.algorithms import build
from fedrun.algorithms.trainer import LocalTrainer
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.tree import head_names, param_names
from fedrun.models.small import CNN, CNNBN, MLP, FedAvgCNN
from fedrun.simulate import Schedule, eval_context

M, B, S, K = 3, 4, 16, 3  # clients, rows per minibatch, image side (1 channel), classes

MODELS = {
    "fedavg_cnn": lambda: FedAvgCNN(S * S, K),  # (no batched forward: the vmapped forward)
    "cnn": lambda: CNN(S * S, K, in_channels=1, image_size=S, channels=4, hidden=(8,)),  # (its batched forward)
    "cnn_bn": lambda: CNNBN(S * S, K, in_channels=1, image_size=S),  # (train_grad)
}
ENGINES = {  # the CPU's default (conv: client by client; CNNBN's train_grad the loop engine's), vmapped, the loop
    "vmap": lambda m: VmapEngine(m),
    "vmap_conv": lambda m: VmapEngine(m, paths={"conv": "vmap"}),
    "loop": lambda m: LoopEngine(m),
}


def _setup(algo_name: str, model_name: str, engine_name: str):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    algo = build(algo_name, lr=0.1, local_epochs=1, head_epochs=1)
    local = algo.start_local(algo.init(params_of(model), M), torch.arange(M), 1)
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(M, B, S * S, generator=g), torch.randint(0, K, (M, B), generator=g))
    return algo, ENGINES[engine_name](model), local, batch


def _full_gradient_head_step(algo, engine, local, batch):
    """The head step as it was: every parameter's gradient, then the head's optimizer along it."""
    g, _, local = LocalTrainer.grad(algo, engine, local, "params", *batch)
    assert set(g) == {k for k in local.params if "running" not in k and "num_batches" not in k}
    head = head_names(local.params)
    return algo.descend(local, "params", g, algo.lr, 1, names=head, slot="opt.head")


@pytest.mark.parametrize("engine_name", list(ENGINES))
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("algo_name", ["fedrep", "fedpac"])
def test_head_step_is_the_full_gradients_update_bit_for_bit(algo_name, model_name, engine_name):
    algo, engine, local, batch = _setup(algo_name, model_name, engine_name)
    out = algo.head_step(engine, local, [batch], 1)
    ref = _full_gradient_head_step(algo, engine, local, batch)
    assert out.params.keys() == ref.params.keys()
    for k in ref.params:  # (the body unchanged, the head stepped; BatchNorm's statistics moved alike)
        assert torch.equal(out.params[k], ref.params[k]), k
    if model_name == "cnn_bn":
        assert not torch.equal(out.params["conv.1.running_mean"], local.params["conv.1.running_mean"])
    head = set(head_names(local.params))
    assert all(torch.equal(out.params[k], local.params[k]) != (k in head) for k in local.params
               if "running" not in k and "num_batches" not in k)


class _CountBackward(TorchDispatchMode):
    """Counts the body's backward kernels (convolutions', BatchNorm's) dispatched."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls += name.startswith("convolution_backward") or "batch_norm_backward" in name
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("engine_name", list(ENGINES))
@pytest.mark.parametrize("model_name", ["cnn", "cnn_bn"])
@pytest.mark.parametrize("algo_name", ["fedrep", "fedpac"])
def test_head_step_runs_no_backward_through_the_body(algo_name, model_name, engine_name):
    """The head step's gradient holds the head's entries only and no convolution (or BatchNorm) backward runs;
    the full gradient of the same state runs them (the counter sees them)."""
    algo, engine, local, batch = _setup(algo_name, model_name, engine_name)
    head = head_names(local.params)
    with _CountBackward() as counted:
        g, _, _ = algo.grad(engine, local, "params", *batch, wrt=head)
        algo.head_step(engine, local, [batch], 1)
    assert list(g) == head and counted.calls == 0
    with _CountBackward() as full:
        algo.grad(engine, local, "params", *batch)
    assert full.calls > 0


class _CountOps(TorchDispatchMode):
    """Counts the dispatches of one aten op (by its packet name)."""

    def __init__(self, op: str):
        super().__init__()
        self.op, self.calls = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket.__name__ == self.op
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backward", ["hand", "autograd"])
def test_fully_connected_backward_stops_at_the_lowest_layer_differentiated(backward):
    """A fully connected model (two hidden layers): the hand-written backward and autograd return `wrt`'s
    gradients alone, each the full gradient's numbers, for the head, a middle layer and a bias alone; the
    hand-written one multiplies nothing below the lowest layer differentiated (its batched products: the
    head's weight gradient alone for the head, against 3 weight gradients and 2 steps down for all)."""
    torch.manual_seed(0)
    model = MLP(5, K, hidden=[7, 6])
    engine = VmapEngine(model, paths={"backward": backward})
    p = {k: v.expand(M, *v.shape).clone() for k, v in params_of(model).items()}
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(M, B, 5, generator=g), torch.randint(0, K, (M, B), generator=g)
    with _CountOps("bmm") as all_products:
        full, loss = engine.grad(p, x, y)
    head = head_names(p)
    middle = [k for k in p if k not in head][2:4]  # the second hidden layer's weight and bias
    assert len(full) == 6 and len(middle) == 2
    for wrt in (head, middle, [middle[1]], list(p)):
        with _CountOps("bmm") as products:
            part, part_loss = engine.grad(p, x, y, wrt=wrt)
        assert list(part) == wrt and torch.equal(part_loss, loss)
        assert all(torch.equal(part[k], full[k]) for k in wrt), wrt
        if backward == "hand" and wrt == head:
            assert (products.calls, all_products.calls) == (1, 5)


@pytest.mark.parametrize("rnn", ["fused", "batched"])
def test_the_lstms_backward_returns_the_subset(rnn):
    """The LSTM's hand-written backward (both recurrences) computes every gradient and returns `wrt`'s, the
    full gradient's numbers."""
    from fedrun.models.rnn import LSTM

    torch.manual_seed(0)
    model = LSTM(6, 9, vocab_size=9, embed_dim=3, hidden=5)
    model.rnn = rnn
    engine = VmapEngine(model, paths={"backward": "hand"})
    p = {k: v.expand(M, *v.shape).clone() for k, v in params_of(model).items()}
    x, y = torch.randint(0, 9, (M, B, 6)), torch.randint(0, 9, (M, B))
    full, loss = engine.grad(p, x, y)
    head = head_names(p)
    part, part_loss = engine.grad(p, x, y, wrt=head)
    assert list(part) == head and len(full) > len(head) and torch.equal(part_loss, loss)
    assert all(torch.equal(part[k], full[k]) for k in head)


@pytest.mark.parametrize("engine_cls", [VmapEngine, LoopEngine])
def test_wrt_must_name_parameters(engine_cls):
    torch.manual_seed(0)
    model = MLP(5, K, hidden=[7])
    p = {k: v.expand(M, *v.shape).clone() for k, v in params_of(model).items()}
    x, y = torch.randn(M, B, 5), torch.randint(0, K, (M, B))
    for wrt, words in ((["head.weight"], "not parameters: ['head.weight']"), ([], "none named")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            engine_cls(model).grad(p, x, y, wrt=wrt)


@pytest.mark.parametrize("name", ["fedrep", "lgfedavg"])
def test_onboarding_differentiates_the_personal_part_only(name, monkeypatch):
    """A held-out client's fit of its personal part (head: FedRep; body: LG-FedAvg) takes that part's gradient
    alone (the numbers: tests/algorithms/test_holdout.py)."""
    data = replace(synthetic(num_clients=4, dim=6, num_classes=K, seed=1, cache_dir=None, chunk_len=16),
                   num_holdout=2)
    algo = build(name)
    torch.manual_seed(0)
    model = MLP(6, K, hidden=[5])
    state = algo.init(params_of(model), data.num_clients)
    seen, real = [], LoopEngine.state_grad

    def spy(self, *args, **kw):
        out = real(self, *args, **kw)
        seen.append(set(out[0]))
        return out
    monkeypatch.setattr(LoopEngine, "state_grad", spy)
    sched = Schedule(rounds=1, tau=2, clients_per_round=2, batch_size=5)
    algo.onboard(LoopEngine(model), state, eval_context(data, sched, 0, 1), torch.arange(2, 4))
    assert len(seen) == 2 and all(s == set(param_names(state.clients.part)) for s in seen)
    assert seen[0] != set(param_names(state.params))
