"""The representation methods (MOON, FedRoD, FedProto, FedDBE; fedrun/algorithms/{moon,fedrod,fedproto,feddbe}.py)
against numbers computed by hand on the tiny problem of test_baselines.py, and their per-client
state through a checkpoint. Their PFLlib traces: tests/test_golden_pfllib_feat.py."""
import pytest
import torch
from test_baselines import run

from fedrun import outputs
from fedrun.algorithms.base import ServerState, flat_clients, state_of
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.feddbe import FedDBE
from fedrun.algorithms.fedproto import FedProto, FedProtoClients, FedProtoLocal
from fedrun.algorithms.fedrod import FedRoD
from fedrun.algorithms.moon import MOON
from fedrun.engine import VmapEngine
from fedrun.errors import ConfigError
from fedrun.simulate import Progress, Schedule, eval_context

ALGOS = [MOON(lr=0.1), FedRoD(lr=0.1), FedProto(lr=0.1, follow="paper"), FedDBE(lr=0.1, kappa=1.0)]


@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: a.name)
def test_state_survives_a_checkpoint_and_resume(tmp_path, algo):
    """3 rounds straight == 2 rounds, a checkpoint written and read back (as the runner does), 1 more:
    per-client state (MOON's previous models, FedRoD's heads and class counts, FedProto's models,
    FedDBE's biases) and server extras (FedProto's prototypes, FedDBE's global mean)."""
    full, last_full, _, _, data = run(algo, rounds=3, clients=2)
    run(algo, rounds=2, clients=2, data=data, on_checkpoint=lambda at: outputs.save_checkpoint(
        str(tmp_path), at.round, {"transmitted": at.transmitted, "state": {
            "params": at.state.params, "extra": at.state.extra, "clients": flat_clients(at.state)}}))
    ck = outputs.load_checkpoint(str(tmp_path))
    assert ck["round"] == 2
    st = ck["state"]
    start = Progress(state_of(algo, st["params"], st["extra"], st["clients"]), 2, 0)
    resumed, last, _, _, _ = run(algo, rounds=3, clients=2, data=data, start=start)
    assert type(resumed.clients) is type(full.clients)
    full_c, resumed_c = flat_clients(full), flat_clients(resumed)
    for name, part in full_c.items():
        for k in part:
            assert torch.equal(part[k], resumed_c[name][k]), (name, k)
    for k, v in full.extra.items():
        assert torch.equal(v, resumed.extra[k]), k
    assert last.row == last_full.row


def test_moon_with_mu_zero_is_fedavg_and_its_contrast_acts():
    a, b = run(MOON(lr=0.1, mu=0.0)), run(FedAvg(beta=0.1, alpha=None))
    for k in a[0].params:
        torch.testing.assert_close(a[0].params[k], b[0].params[k], rtol=1e-5, atol=1e-6)
    c = run(MOON(lr=0.1, mu=5.0))
    assert (c[0].params["net.0.weight"] - a[0].params["net.0.weight"]).abs().max() > 1e-4


def test_fedrod_counts_classes_and_serves_the_sum_of_both_heads():
    state, _, _, model, data = run(FedRoD(lr=0.1), rounds=2)
    assert torch.equal(state.clients.counts["n"], data.train.label_counts(4).to(state.clients.counts["n"].dtype))
    algo, engine = FedRoD(lr=0.1), VmapEngine(model)
    served, _ = algo.personalize(engine, state, eval_context(data, Schedule(1, 1, 1, 5), 0, 1))
    x = data.test.x[:7]
    z = engine.features(state.params, x)
    for c in (0, 3):  # h_G(z) + h_P(z), the personal head applied by hand
        mine = z @ state.clients.head["net.2.weight"][c].T + state.clients.head["net.2.bias"][c]
        got = engine.logits({k: v[c] for k, v in served.items()}, x)
        torch.testing.assert_close(got, engine.logits(state.params, x) + mine, rtol=1e-5, atol=1e-6)


def test_feddbe_global_mean_by_hand_and_its_bias_served_before_the_head():
    """The global mean fixed before round 1: the clients' running means after their plain-CE round,
    weighted by rows (recomputed here step by step); served: h(f(x) + m_i)."""
    algo = FedDBE(lr=0.1, kappa=1.0, momentum=0.3)
    state, _, _, model, data = run(algo, rounds=1)
    engine = VmapEngine(model)
    ctx = eval_context(data, Schedule(1, 3, 3, 5), 0, 0)
    t = data.num_train_clients
    local = algo.client_init(algo.init({k: v for k, v in model.state_dict().items()}, data.num_clients),
                             torch.arange(t), 0)
    running, params = torch.zeros(t, local.running.shape[1]), local.params
    from fedrun.algorithms.feddbe import init_rows

    for rows in init_rows(ctx, torch.arange(t), None).unbind(1):
        x, y = data.train.rows(rows)
        running = 0.7 * running + 0.3 * torch.stack(
            [engine.features({k: v[c] for k, v in params.items()}, x[c]).mean(0) for c in range(t)])
        g, _ = engine.grad(params, x, y)
        params = {k: v - 0.1 * g[k] for k, v in params.items()}
    n = data.train.sizes[:t].to(running.dtype)
    torch.testing.assert_close(state.extra["global_mean"], (n.unsqueeze(1) * running).sum(0) / n.sum(),
                               rtol=1e-5, atol=1e-6)
    served, _ = algo.personalize(engine, state, ctx)
    x = data.test.x[:5]
    z = engine.features(state.params, x)
    for c in (0, 2):
        by_hand = (z + state.clients.dbe["bias"][c]) @ state.params["net.2.weight"].T + state.params["net.2.bias"]
        torch.testing.assert_close(engine.logits({k: v[c] for k, v in served.items()}, x), by_hand,
                                   rtol=1e-5, atol=1e-6)


def test_fedproto_global_prototypes_by_hand():
    """Two clients' local prototypes (their class sums over counts): unweighted, the mean over the
    clients that have the class; weighted (paper), by their rows; a class neither has: none."""
    sums = torch.tensor([[[2.0, 0.0], [0.0, 0.0], [3.0, 3.0]], [[4.0, 8.0], [1.0, 1.0], [0.0, 0.0]]])
    counts = torch.tensor([[1.0, 0.0, 3.0], [4.0, 1.0, 0.0]])
    local = FedProtoLocal(params={"w": torch.zeros(2, 1)}, protos=torch.zeros(2, 3, 2),
                          present=torch.zeros(2, 3, dtype=torch.bool), sums=sums, counts=counts)
    state = ServerState(params={"w": torch.zeros(1)}, extra={},
                        clients=FedProtoClients(params={"w": torch.zeros(3, 1)}))
    pick = torch.tensor([0, 1])
    plain = FedProto(lr=0.1, follow="pfllib").server_update(state, local, pick, pick, None).extra
    paper = FedProto(lr=0.1, follow="paper").server_update(state, local, pick, pick, None).extra
    assert plain["present"].tolist() == paper["present"].tolist() == [True, True, True]
    torch.testing.assert_close(plain["protos"], torch.tensor([[1.5, 1.0], [1.0, 1.0], [1.0, 1.0]]))
    torch.testing.assert_close(paper["protos"], torch.tensor([[6.0 / 5, 8.0 / 5], [1.0, 1.0], [1.0, 1.0]]))
    one = FedProto(lr=0.1, follow="pfllib").server_update(state, local, pick, pick[:1], None).extra
    assert one["present"].tolist() == [True, False, True]


def test_bad_values_are_one_line():
    for make, option in [(lambda: MOON(temperature=0.0), "algo.temperature"), (lambda: MOON(mu=-1.0), "algo.mu"),
                         (lambda: FedProto(follow="authors"), "algo.follow"), (lambda: FedProto(lam=-1.0), "algo.lam"),
                         (lambda: FedProto(finetune_steps=3), "algo.finetune_steps=0"),
                         (lambda: FedRoD(new_client_steps=0), "algo.new_client_steps"),
                         (lambda: FedDBE(momentum=1.5), "algo.momentum"), (lambda: FedDBE(kappa=-1.0), "algo.kappa")]:
        with pytest.raises(ConfigError, match=option) as e:
            make()
        assert "\n" not in str(e.value)


def test_feddbe_global_mean_in_local_epochs_by_hand():
    """With local_epochs=E the round before round 1 is E passes over each client's own rows, as
    PFLlib's constructor runs every client's train(): floor(n_c / B) minibatches a pass (the golden
    clients' 12, 16, 20, 8 rows at B=5: 2, 3, 4, 1), each pass a fresh shuffle of round 0's evaluation
    stream, r carried across the passes. Recomputed client by client (torch.func.functional_call and
    autograd, not the engine's step); chunked one client at a time, the same mean bit for bit."""
    import dataclasses

    from test_golden_pfedme import golden_data
    from torch.func import functional_call

    from fedrun.algorithms import build
    from fedrun.models import MLP
    from fedrun.simulate import ChunkedTraining

    data, E, B, lr, mom = golden_data(), 2, 5, 0.1, 0.3
    torch.manual_seed(0)
    model = MLP(12, 4, hidden=[8])
    engine, params = VmapEngine(model), {k: v.detach() for k, v in model.state_dict().items()}
    algo = build("feddbe", lr=lr, kappa=1.0, momentum=mom, local_epochs=E)
    sched = Schedule(rounds=1, tau=3, clients_per_round=4, batch_size=B)
    means = [algo.prepare(engine, algo.init(params, data.num_clients), dataclasses.replace(
        eval_context(data, sched, 0, 0), chunked=ChunkedTraining(size).map)).extra["global_mean"] for size in (None, 1)]
    assert torch.equal(means[0], means[1])

    t, sizes = data.num_train_clients, data.train.sizes[: data.num_train_clients]
    per_pass = (sizes // B).tolist()
    assert per_pass == [2, 3, 4, 1]
    L = max(per_pass)  # every client's draw is E blocks of L minibatches (the longest pass), the rest unused
    rows = data.train.shuffled_indices(torch.arange(t), E, L * B, eval_context(data, sched, 0, 0).gen)
    running = []
    for c in range(t):
        p, r = dict(params), torch.zeros(8)
        for e in range(E):
            for s in range(per_pass[c]):
                x, y = data.train.rows(rows[c, e, s * B:(s + 1) * B])
                with torch.no_grad():
                    r = (1 - mom) * r + mom * engine.features(p, x).mean(0)
                p = {k: v.requires_grad_() for k, v in p.items()}
                loss = torch.nn.functional.cross_entropy(functional_call(model, p, (x,)), y)
                g = torch.autograd.grad(loss, list(p.values()))
                p = {k: (v - lr * gk).detach() for (k, v), gk in zip(p.items(), g)}
        running.append(r)
    n = sizes.to(torch.float32)
    by_hand = (n.unsqueeze(1) * torch.stack(running)).sum(0) / n.sum()
    # float32: ~10 steps a client of a few ops each, features of magnitude ~1: ~100 eps32 (1.2e-7)
    torch.testing.assert_close(means[0], by_hand, rtol=2e-5, atol=2e-6)
