"""The PFL baselines (FedProx, Local, fine-tuning, Ditto, APFL, FedPer, LG-FedAvg, FedRep, FedBABU)
against hand-computed numbers on toy problems, and their per-client state across a resume."""
import pytest
import torch
from helpers import half_squared, quad_grad, quadratic_setup

from fedrun import outputs
from fedrun.algorithms import build, names
from fedrun.algorithms.apfl import APFL, APFLLocal
from fedrun.algorithms.base import ServerState, client_entries, flat_clients, state_of
from fedrun.algorithms.ditto import Ditto, DittoLocal
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.fedbabu import FedBABU
from fedrun.algorithms.fedbn import FedBN
from fedrun.algorithms.fedpac import FedPAC
from fedrun.algorithms.fedper import FedPer
from fedrun.algorithms.fedprox import FedProx
from fedrun.algorithms.fedrep import FedRep, FedRepLocal
from fedrun.algorithms.lgfedavg import LGFedAvg
from fedrun.algorithms.local import LocalOnly, LocalOnlyLocal
from fedrun.algorithms.personalize import finetune, finetune_epochs
from fedrun.data import synthetic
from fedrun.data.federated import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of, stack
from fedrun.engine.tree import head_names, per_client
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN, MLR
from fedrun.simulate import Progress, Schedule, eval_context, simulate

ENGINES = [VmapEngine, LoopEngine]


@pytest.mark.parametrize("E", ENGINES)
def test_fedprox_two_steps_on_a_quadratic(E):
    model, params, batches = quadratic_setup()
    engine, beta, mu = E(model, criterion=half_squared), 0.1, 0.7
    algo = FedProx(beta=beta, mu=mu)
    w0 = params["weight"][:, 0]
    state = ServerState(params={"weight": params["weight"][0]})
    local = algo.client_init(state, torch.arange(3), 1)
    local = local._replace(params={"weight": params["weight"].clone()},  # per-client starting points (anchor: w^t =
                           anchor={"weight": params["weight"][:1].expand_as(params["weight"])})  # client 0's)
    for b in batches[:2]:
        local = algo.client_step(engine, local, [b], 1)
    for i in range(3):
        anchor = w0[0]
        w1 = w0[i] - beta * (quad_grad(w0[i], *[t[i] for t in batches[0]]) + mu * (w0[i] - anchor))
        w2 = w1 - beta * (quad_grad(w1, *[t[i] for t in batches[1]]) + mu * (w1 - anchor))
        torch.testing.assert_close(local.params["weight"][i, 0], w2, rtol=1e-12, atol=1e-12)


def tiny(num_clients=6, seed=1):
    return synthetic(num_clients=num_clients, dim=6, num_classes=4, seed=seed, cache_dir=None, chunk_len=16)


def run(algo, rounds=3, data=None, clients=3, tau=3, seed=0, start=None, on_checkpoint=None):
    data = data or tiny()
    torch.manual_seed(0)
    model = MLPBN(6, 4, hidden=[5]) if algo.name == "fedbn" else MLP(6, 4, hidden=[5])  # FedBN needs BatchNorm
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


def test_local_clients_train_alone_and_the_server_model_never_moves():
    state, last, _, model, data = run(LocalOnly(lr=0.1), rounds=2, clients=6)
    init = params_of(model)
    for k in init:
        assert torch.equal(state.params[k], init[k])
    # a client's model is its own SGD path: the same as LocalOnly on a one-client copy of its data
    for k in init:
        assert not torch.equal(state.clients.params[k][0], state.clients.params[k][1])
    assert last.row["pers_acc"] != last.row["global_acc"]
    assert LocalOnly.models_per_round == 0


def test_local_unsampled_clients_keep_their_initial_model():
    state, _, _, model, _ = run(LocalOnly(lr=0.1), rounds=1, clients=2)
    init = params_of(model)
    moved = [not torch.equal(state.clients.params["net.0.weight"][c], init["net.0.weight"]) for c in range(6)]
    assert sum(moved) == 2


@pytest.mark.parametrize("E", ENGINES)
def test_ditto_two_steps_by_hand_and_lam_zero_is_local_training(E):
    model, params, batches = quadratic_setup()
    engine, lr, plr, lam = E(model, criterion=half_squared), 0.2, 0.1, 0.5
    w0 = params["weight"]
    v0 = w0 + 0.3
    steps = [batches[:2], batches[1:]]  # (global batch, personal batch) of two local steps
    for lam_ in (lam, 0.0):
        algo = Ditto(lr=lr, personal_lr=plr, lam=lam_)
        local = DittoLocal(params={"weight": w0.clone()}, anchor={"weight": w0}, personal={"weight": v0})
        for b in steps:
            local = algo.client_step(engine, local, b, 1)
        for i in range(3):
            w, v = w0[i, 0], v0[i, 0]
            for (xg, yg), (xp, yp) in steps:  # the personal model is pulled to w^t = w0, not to the moving w
                v = v - plr * (quad_grad(v, xp[i], yp[i]) + lam_ * (v - w0[i, 0]))
                w = w - lr * quad_grad(w, xg[i], yg[i])
            torch.testing.assert_close(local.params["weight"][i, 0], w)
            torch.testing.assert_close(local.personal["weight"][i, 0], v)
        if lam_ == 0.0:  # the personal model took exactly LocalOnly's steps on the personal batches
            ref = LocalOnlyLocal(params={"weight": v0})
            for b in steps:
                ref = LocalOnly(lr=plr).client_step(engine, ref, [b[1]], 1)
            assert torch.equal(local.personal["weight"], ref.params["weight"])


@pytest.mark.parametrize("E", ENGINES)
def test_apfl_step_by_hand(E):
    model, params, batches = quadratic_setup()
    engine, lr, alr = E(model, criterion=half_squared), 0.2, 0.3
    w0 = params["weight"]
    v0 = w0 + 0.4
    a0 = torch.tensor([[0.2], [0.5], [0.9]], dtype=torch.float64)
    out = APFL(lr=lr, alpha=0.5, alpha_lr=alr).client_step(
        engine, APFLLocal(params={"weight": w0}, v={"weight": v0}, alpha=a0), [batches[0]], 1)
    for i in range(3):
        x, y = batches[0][0][i], batches[0][1][i]
        w, v, a = w0[i, 0], v0[i, 0], a0[i, 0]
        vbar = a * v + (1 - a) * w
        gbar = quad_grad(vbar, x, y)
        torch.testing.assert_close(out.params["weight"][i, 0], w - lr * quad_grad(w, x, y))
        torch.testing.assert_close(out.v["weight"][i, 0], v - lr * a * gbar)
        torch.testing.assert_close(out.alpha[i, 0], (a - alr * (v - w) @ gbar).clamp(0, 1))


def test_apfl_fixed_alpha_zero_serves_the_global_model():
    state, last, _, _, _ = run(APFL(lr=0.1, alpha=0.0, alpha_lr=0.0))
    assert (state.clients.mix["alpha"] == 0).all()
    assert last.row["pers_acc"] == pytest.approx(last.row["global_acc"], abs=1e-6)


def test_apfl_alpha_must_be_a_fraction():
    with pytest.raises(ConfigError, match=r"algo.alpha=1.5 must be a number in \[0, 1\]"):
        APFL(alpha=1.5)


def test_head_is_the_output_layer():
    model = MLP(6, 4, hidden=[5, 3])
    assert head_names(params_of(model)) == ["net.4.weight", "net.4.bias"]


@pytest.mark.parametrize("cls,personal", [(FedPer, "head"), (LGFedAvg, "body")])
def test_fedper_and_lgfedavg_average_one_part_and_keep_the_other(cls, personal):
    state, _, _, model, data = run(cls(lr=0.1), rounds=1, clients=2)
    init = params_of(model)
    head = head_names(init)
    mine = head if personal == "head" else [k for k in init if k not in head]
    assert set(state.clients.part) == set(mine)
    for k in mine:  # the server's copy of the personal part never moves
        assert torch.equal(state.params[k], init[k])
    for k in init:
        if k not in mine:
            assert not torch.equal(state.params[k], init[k])
    moved = [not torch.equal(state.clients.part[mine[0]][c], init[mine[0]]) for c in range(6)]
    assert sum(moved) == 2


@pytest.mark.parametrize("E", ENGINES)
def test_fedrep_trains_the_head_first_then_the_body(E):
    torch.manual_seed(0)
    model = MLP(6, 4, hidden=[5])
    p0 = stack(params_of(model), 2)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 5, 6, generator=g), torch.randint(0, 4, (2, 5), generator=g)) for _ in range(3)]
    engine = E(model)
    algo = FedRep(lr=0.1, head_steps=2)
    local = FedRepLocal(params=p0, step=torch.zeros(2, 1, dtype=torch.long))
    head = head_names(p0)
    expected = dict(p0)
    for s, b in enumerate(batches):
        local = algo.client_step(engine, local, [b], 1)
        gr, _ = engine.grad(expected, *b)
        expected = {k: expected[k] - 0.1 * gr[k] if (k in head) == (s < 2) else expected[k] for k in expected}
        for k in p0:
            torch.testing.assert_close(local.params[k], expected[k])
    for k in p0:  # both phases happened
        assert not torch.equal(local.params[k], p0[k])


def test_fedbabu_keeps_the_head_at_its_initial_value_and_fine_tunes_at_test_time():
    state, last, _, model, data = run(FedBABU(beta=0.1, alpha=0.1, finetune_steps=1), rounds=2)
    init = params_of(model)
    for k in head_names(init):
        assert torch.equal(state.params[k], init[k])
    assert not torch.equal(state.params["net.0.weight"], init["net.0.weight"])
    # its test-time fine-tuning of one step is FedAvg's one-step update of the same model
    fedavg = FedAvg(beta=0.1, alpha=0.1)
    ctx = eval_context(data, Schedule(rounds=2, tau=3, clients_per_round=3, batch_size=5), 0, 2)
    a, _ = FedBABU(beta=0.1, alpha=0.1, finetune_steps=1).personalize(VmapEngine(model), state, ctx)
    b, _ = fedavg.personalize(VmapEngine(model), state, ctx)
    for k in a:
        assert torch.equal(a[k], b[k])


def tiny_f64():
    """tiny() with float64 rows and a seeded float64 MLP 6-5-4 (fine-tuning checked against autograd)."""
    data = tiny()
    torch.manual_seed(0)
    data.train.x = data.train.x.double()
    return data, MLP(6, 4, hidden=[5]).double()


@pytest.mark.parametrize("E", ENGINES)
def test_finetune_steps_are_full_batch_gradient_steps(E):
    data, model = tiny_f64()
    engine, p = E(model), params_of(model)
    ctx = eval_context(data, Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=5), 0, 1)
    got, loss = finetune(engine, p, ctx, 0.3, 3)
    for c in range(data.num_clients):
        rows = data.train.client_rows(c)
        q = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        for s in range(3):
            out = torch.nn.functional.cross_entropy(torch.func.functional_call(model, q, (data.train.x[rows],)),
                                                    data.train.y[rows])
            gr = torch.autograd.grad(out, list(q.values()))
            if s == 0:
                torch.testing.assert_close(loss[c], out.detach())
            q = {k: (v - 0.3 * g).detach().requires_grad_(True) for (k, v), g in zip(q.items(), gr)}
        for k in p:
            torch.testing.assert_close(got[k][c], q[k].detach(), rtol=1e-10, atol=1e-12)
    one, _ = finetune(engine, p, ctx, 0.3, 1)
    assert not torch.equal(one["net.0.weight"], got["net.0.weight"])


@pytest.mark.parametrize("algo", [Ditto(lr=0.1, personal_lr=0.1, lam=0.1), APFL(lr=0.1, alpha=0.5, alpha_lr=0.1),
                                  FedRep(lr=0.1, head_steps=1), LocalOnly(lr=0.1), FedBN(lr=0.1)], ids=lambda a: a.name)
def test_per_client_state_survives_a_checkpoint_and_resume(tmp_path, algo):
    """3 rounds straight == 2 rounds, a checkpoint written and read back (as the runner does), 1 more."""
    full, last_full, _, _, data = run(algo, rounds=3, clients=2)
    saved = []
    run(algo, rounds=2, clients=2, data=data, on_checkpoint=lambda at: saved.append(outputs.save_checkpoint(
        str(tmp_path), at.round, {"transmitted": at.transmitted,
                                  "state": {"params": at.state.params, "extra": at.state.extra,
                                            "clients": flat_clients(at.state)}})))
    ck = outputs.load_checkpoint(str(tmp_path))
    assert ck["round"] == 2 and ck["state"]["clients"]
    st = ck["state"]
    start = Progress(state_of(algo, st["params"], st["extra"], st["clients"]), ck["round"], ck["transmitted"])
    resumed, last, _, _, _ = run(algo, rounds=3, clients=2, data=data, start=start)
    assert type(resumed.clients) is type(full.clients)
    full_c, resumed_c = flat_clients(full), flat_clients(resumed)
    for name in full_c:
        for k in full_c[name]:
            assert torch.equal(full_c[name][k], resumed_c[name][k]), (name, k)
    for k, v in full.extra.get("buffers", {}).items():  # FedBN's server BatchNorm statistics
        assert torch.equal(v, resumed.extra["buffers"][k]), k
    assert last.row == last_full.row


@pytest.mark.parametrize("E", ENGINES)
def test_finetune_epochs_are_shuffled_passes_with_drop_last_per_client(E):
    data, model = tiny_f64()
    B = int(data.train.sizes.max()) // 3  # the largest client takes 3 steps a pass, the others fewer
    engine, p, epochs, lr = E(model), params_of(model), 2, 0.3
    sched = Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=B)
    got, _ = finetune_epochs(engine, p, eval_context(data, sched, 0, 1), lr, epochs)
    n = data.train.sizes
    S = int((n // B).max())
    idx = data.train.shuffled_indices(torch.arange(6), epochs, S * B, eval_context(data, sched, 0, 1).gen)
    assert len(set((n // B).tolist())) > 1  # clients take different numbers of steps
    for c in range(6):
        q = dict(p)
        for e in range(epochs):
            for s in range(int(n[c]) // B):  # its own floor(n_c / B) steps per pass, the rest dropped
                rows = idx[c, e, s * B:(s + 1) * B]
                assert len(set(rows.tolist())) == B and all(
                    data.train.client_rows(c).start <= r < data.train.client_rows(c).stop for r in rows.tolist())
                qq = {k: v.clone().requires_grad_(True) for k, v in q.items()}
                out = torch.nn.functional.cross_entropy(torch.func.functional_call(model, qq, (data.train.x[rows],)),
                                                        data.train.y[rows])
                q = {k: (v - lr * g).detach()
                     for (k, v), g in zip(qq.items(), torch.autograd.grad(out, list(qq.values())))}
        for k in p:
            torch.testing.assert_close(got[k][c], q[k], rtol=1e-10, atol=1e-12)


def uneven_f64():
    """7 clients of 9, 2, 5, 7, 1, 4, 6 float64 rows of 4 features, 3 classes: at B = 3, 3, 0, 1, 2, 0,
    1, 2 steps a pass (two clients not fine-tuned); also their sizes and the generator, for more draws."""
    sizes, g = torch.tensor([9, 2, 5, 7, 1, 4, 6]), torch.Generator().manual_seed(3)
    n = int(sizes.sum())
    x, y = torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)
    split = ClientSplit.from_flat(x, y, sizes, 4)
    return FederatedData("uneven", split, ClientSplit.from_flat(x, y, sizes, 4), 3), sizes, g


def masked_finetune_epochs(engine, params, ctx, lr, epochs, stacked=False):
    """finetune_epochs as it was before it cost the work done (kept as the reference): every client
    steps for the largest client's count, its update multiplied by 0 and its BatchNorm buffers kept
    after its own last step."""
    split = ctx.data.train
    B = ctx.personalize_batch or ctx.batch_size
    steps = split.sizes.cpu() // B
    S = max(int(steps.max()), 1)
    idx = split.shuffled_indices(torch.arange(split.num_clients), epochs, S * B, ctx.gen).view(
        split.num_clients, epochs, S, B)
    live = torch.arange(S).view(1, -1) < steps.view(-1, 1)
    p = params if stacked else stack(params, split.num_clients)
    for e in range(epochs):
        for s in range(S):
            x, y = split.rows(idx[:, e, s])
            g, _, buffers = engine.state_grad(p, x, y)
            on = live[:, s]
            p = {**p, **{k: p[k] - lr * per_client(on, p[k]) * g[k] for k in g},
                 **{k: torch.where(per_client(on, b).bool(), b, p[k]) for k, b in buffers.items()}}
    return p


@pytest.mark.parametrize("E", ENGINES)
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("bn", [False, True], ids=["mlp", "mlp_bn"])
def test_finetune_epochs_by_work_equals_the_masked_fine_tuning(E, stacked, bn):
    """finetune_epochs computes, each step, only the clients still in the pass (sorted by their steps):
    each client's parameters and BatchNorm buffers are those of the masked computation (float64,
    uneven clients, two of them under B rows and so not fine-tuned).
    Loop engine: equal to the bit (each client computed alone, by the same ops in the same order).
    Vmap: the same per-client math, but a vectorized kernel's SIMD body and scalar tail (FMA or not)
    fall on a client's numbers by where it sits among the clients computed beside it, so roundings
    may differ (1 ulp seen on BatchNorm models). Bound: a step's value is ~50 roundings of O(1)
    numbers (randn rows, widths 4-5-3, B = 3): <= 50 eps ~ 1e-14; 6 steps (2 passes of <= 3), each
    carrying the earlier difference through I - lr H (lr 0.3, |H| <= ~3: a factor <= 2):
    1e-14 x 6 x 2^6 ~ 4e-12 -> 1e-11. A client stepped once too often or too few moves by lr |g| ~ 1e-2."""
    data, sizes, g = uneven_f64()
    torch.manual_seed(0)
    model = (MLPBN if bn else MLP)(4, 3, hidden=[5]).double()
    start = params_of(model)
    if stacked:  # each client's own start (and its own BatchNorm statistics)
        start = {k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v
                 for k, v in stack(start, len(sizes)).items()}
    sched = Schedule(rounds=1, tau=1, clients_per_round=1, batch_size=3)
    got, _ = finetune_epochs(E(model), start, eval_context(data, sched, 0, 1), 0.3, 2, stacked=stacked)
    want = masked_finetune_epochs(E(model), start, eval_context(data, sched, 0, 1), 0.3, 2, stacked=stacked)
    assert set(got) == set(want) == set(start) and (not bn or any("running_var" in k for k in got))
    first = {k: v if stacked else v.expand(len(sizes), *v.shape) for k, v in start.items()}
    for k in want:
        assert got[k].shape == want[k].shape, k
        if E is LoopEngine or not want[k].is_floating_point():
            assert torch.equal(got[k], want[k]), k
        else:
            torch.testing.assert_close(got[k], want[k], rtol=1e-11, atol=1e-11, msg=k)
        assert torch.equal(got[k][[1, 4]], first[k][[1, 4]]), k  # under B rows: not fine-tuned
    assert all(not torch.equal(got["net.0.weight"][c], first["net.0.weight"][c]) for c in (0, 2, 3, 5, 6))


def test_finetune_epochs_cost_the_sum_of_the_clients_steps():
    """Fine-tuning in epochs computes a client only while it has steps left in the pass: the gradients
    taken, summed over steps, are sum_c epochs x floor(n_c / B) client-steps, not clients x epochs x
    the largest client's count (as when every client stepped with a mask)."""
    data, _, _ = uneven_f64()
    torch.manual_seed(0)
    model, B, epochs = MLP(4, 3, hidden=[5]).double(), 3, 2
    engine, computed = VmapEngine(model), []
    real = engine.state_grad
    engine.state_grad = lambda p, x, y: computed.append(len(x)) or real(p, x, y)
    finetune_epochs(engine, params_of(model), eval_context(data, Schedule(rounds=1, tau=1, clients_per_round=1,
                                                                          batch_size=B), 0, 1), 0.3, epochs)
    steps = data.train.sizes // B
    assert len(set(steps.tolist())) > 1  # uneven: 2 x 9 = 18 client-steps; masked, 7 x 2 x 3 = 42
    assert sum(computed) == epochs * int(steps.sum()) < data.num_clients * epochs * int(steps.max())
    assert len(computed) == epochs * int(steps.max())  # still vectorized: one call a step


@pytest.mark.parametrize("name", names())
def test_every_algorithm_trains_an_mlr_or_refuses_it_in_one_line(name):
    """MLR is a head alone: an algorithm that splits the model (FedPer, LG-FedAvg, FedRep, FedBABU)
    would share or train nothing, so it refuses the model before any work; every other algorithm
    moves its state in one step (FedBABU used to run with all of it frozen)."""
    data = tiny()
    torch.manual_seed(0)
    model = MLR(6, 4)
    algo, init = build(name), params_of(model)
    try:
        algo.check_params(init)
    except ConfigError as e:
        assert "\n" not in str(e) and f"algo={name}" in str(e) and "model=mlp" in str(e)
        return
    state, _ = simulate(algo, VmapEngine(model), data, init,
                        Schedule(rounds=1, tau=1, clients_per_round=3, batch_size=5), 0)
    moved = [not torch.equal(state.params[k], init[k]) for k in init]
    moved += [not torch.equal(v, v[-1:].expand_as(v)) for part in client_entries(state.clients).values()
              for v in _tensors(part)]
    assert any(moved), f"algo={name} ran on MLR and trained nothing"


def _tensors(part) -> list:
    return [t for v in part.values() for t in _tensors(v)] if isinstance(part, dict) else [part]


@pytest.mark.parametrize("algo, tau, words", [
    (lambda: FedRep(head_steps=5), 5, "algo.head_steps=5 with tau=5 never trains algo=fedrep's body (head_steps steps "
                                      "train the head, the rest of tau the body); allowed: 1 <= algo.head_steps <= 4 "
                                      "(or tau >= 6)"),
    (lambda: FedRep(head_steps=0), 3, "algo.head_steps=0 with tau=3 never trains algo=fedrep's head"),
    (lambda: FedPAC(head_steps=5), 2, "algo.head_steps=5 with tau=2 never trains algo=fedpac's body"),
    (lambda: FedRep(head_steps=1), 1, "algo=fedrep with tau=1 cannot train both parts"),
])
def test_a_tau_that_leaves_a_part_of_fedrep_or_fedpac_untrained_is_refused(algo, tau, words):
    """Their yaml's head_steps=5 at any tau <= 5 trained the head alone, silently (the body, which the
    server averages, stayed the initial one)."""
    with pytest.raises(ConfigError) as e:
        algo().check_tau(tau)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_fedrep_and_fedpac_take_a_tau_that_trains_both_parts_and_any_in_epochs():
    FedRep(head_steps=5).check_tau(6)
    FedPAC(head_steps=1).check_tau(2)
    FedRep(head_steps=5, local_epochs=1).check_tau(1)  # passes: head_epochs, then local_epochs
    FedRep(head_epochs=0)  # unused without local_epochs


@pytest.mark.parametrize("cls, options, words", [
    (FedRep, dict(local_epochs=1, head_epochs=0), "algo.head_epochs=0 with algo.local_epochs=1 never trains "
                                                  "algo=fedrep's head; allowed: algo.head_epochs >= 1"),
    (FedPAC, dict(local_epochs=2, head_epochs=0), "algo.head_epochs=0 with algo.local_epochs=2 never trains "
                                                  "algo=fedpac's head"),
    (Ditto, dict(local_epochs=1, personal_epochs=0), "algo.personal_epochs=0 with algo.local_epochs=1 never trains "
                                                     "algo=ditto's personal models"),
])
def test_a_phase_of_no_passes_is_refused(cls, options, words):
    with pytest.raises(ConfigError) as e:
        cls(**options)
    assert words in str(e.value) and "\n" not in str(e.value)
