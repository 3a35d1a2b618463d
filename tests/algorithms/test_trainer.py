"""The local trainer (fedrun/algorithms/trainer.py) under every algorithm that takes `optim.*`: each
model's optimizer steps, as the method threads them through its rounds, equal torch.optim's run per
client on the same gradients; the epochs unit computed by work (sorted clients, only those still
training) equals the masked computation."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedrun.algorithms import algorithm_class, build, names
from fedrun.algorithms.optim import LocalOptim
from fedrun.algorithms.options import signature_options
from fedrun.algorithms.trainer import LocalTrainer, RunInfo
from fedrun.bench.agreement import declared_options
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import MLP, MLPBN
from fedrun.simulate import Schedule, local_training, one_step, simulate

D, K, B = 5, 3, 2
SIZES = (6, 4, 2)
OPTIMS = {"momentum_wd": (LocalOptim(momentum=0.9, weight_decay=5e-4, state="restart"),
                          lambda ps: torch.optim.SGD(ps, lr=1.0, momentum=0.9, weight_decay=5e-4, foreach=False)),
          "nesterov": (LocalOptim(momentum=0.5, nesterov=True, state="restart"),
                       lambda ps: torch.optim.SGD(ps, lr=1.0, momentum=0.5, nesterov=True, foreach=False)),
          "adam": (LocalOptim(name="adam", state="restart"), lambda ps: torch.optim.Adam(ps, lr=1.0, foreach=False))}


def problem():
    g = torch.Generator().manual_seed(5)
    sizes = torch.tensor(SIZES)
    n = int(sizes.sum())
    x, y = torch.randn(n, D, generator=g, dtype=torch.float64), torch.randint(0, K, (n,), generator=g)
    xt = torch.randn(n, D, generator=g, dtype=torch.float64)
    train, test = ClientSplit.from_flat(x, y, sizes, 4), ClientSplit.from_flat(xt, y.clone(), sizes, 4)
    return FederatedData("trainer", train, test,
                         K)


def optim_algos() -> list[str]:
    return [a for a in names() if algorithm_class(a).optim_ok]


def _spied_run(algo_name: str, optim: LocalOptim, monkeypatch, engine_cls=VmapEngine):
    calls = []
    real = LocalTrainer.descend

    def spy(self, local, key, g, lr, rnd, names=None, slot=None, live=None):
        out = real(self, local, key, g, lr, rnd, names, slot, live)
        name = slot or ("opt" if key == "params" else f"opt.{key}")
        calls.append(dict(slot=name, key=key, fresh=name not in local.opt and not in_round,  # (evaluation's)
                          before={k: v.detach().clone() for k, v in getattr(local, key).items()},
                          after={k: v.detach().clone() for k, v in getattr(out, key).items()},
                          g={k: v.detach().clone() for k, v in g.items()}, lr=self.optim.lr_at(lr, rnd),
                          live=None if live is None else live.clone(), names=names))
        return out

    real_start = LocalTrainer.start_local

    real_end = LocalTrainer.end_round
    in_round = False

    def start(self, state, clients, rnd):  # a round starts: a fresh optimizer (optim.state=restart)
        nonlocal in_round
        calls.append(dict(slot=None, round=rnd))
        in_round = True
        return real_start(self, state, clients, rnd)

    def end(self, *args):
        nonlocal in_round
        in_round = False
        calls.append(dict(slot=None, round=None))  # (steps after it, e.g. evaluation's, start afresh)
        return real_end(self, *args)

    monkeypatch.setattr(LocalTrainer, "descend", spy)
    monkeypatch.setattr(LocalTrainer, "start_local", start)
    monkeypatch.setattr(LocalTrainer, "end_round", end)
    options = declared_options(algo_name)
    if "weight_decay" in signature_options(algorithm_class(algo_name)) and optim.weight_decay:
        options["weight_decay"] = 0.0  # (the debiasing methods' own L2 term: one of the two, refused together)
    if algo_name == "gpfl" and optim.weight_decay:
        options["mu"] = 0.0  # (GPFL's CoV and GCE weight decay: the same)
    algo = build(algo_name, **options)
    algo = algo.bind(replace(algo.run, optim=optim))
    torch.manual_seed(0)
    model = (MLPBN if algo_name == "fedbn" else MLP)(D, K, hidden=[4]).double()  # (FedBN needs BatchNorm)
    data = problem()
    sched = Schedule(rounds=2, tau=2, clients_per_round=len(SIZES), batch_size=B)
    state, _ = simulate(algo, engine_cls(model), data, params_of(model), sched, 0)
    return calls, state


@pytest.mark.parametrize("optim", list(OPTIMS))
@pytest.mark.parametrize("algo_name", optim_algos())
def test_each_models_optimizer_steps_are_torch_optims_per_client(algo_name, optim, monkeypatch):
    """Replays every `descend` call of two rounds (optim.state=restart: each round a fresh optimizer)
    through torch.optim, one optimizer per (client, slot), fed the same gradients: each step's result
    must be torch's. A method that dropped a slot's state between its steps, stepped a model twice, or
    used another update than the optimizer's, fails here."""
    ours, torch_make = OPTIMS[optim]
    calls, _ = _spied_run(algo_name, ours, monkeypatch)
    keys = {}  # slot -> the entries its optimizer updates
    torch_opts: dict = {}  # (round tag, slot, client) -> (params, optimizer)
    round_tag = 0
    assert any(c["slot"] for c in calls), f"{algo_name} never stepped through the local trainer's descend"
    for c in calls:
        if c["slot"] is None:
            round_tag += 1
            continue
        m = next(iter(c["g"].values())).shape[0]
        names_ = [k for k in c["before"] if k in c["g"] and not k.endswith(("running_mean", "running_var",
                                                                             "num_batches_tracked"))]
        if c["names"] is not None:
            names_ = [k for k in c["before"] if k in set(c["names"])]
        keys[c["slot"]] = names_
        for i in range(m):
            if c["live"] is not None and not bool(c["live"][i]):
                continue
            slot_key = (round_tag, c["slot"], i)
            if slot_key not in torch_opts or (c["fresh"] and not ours.plain):
                ps = [torch.nn.Parameter(c["before"][k][i].clone()) for k in names_]
                torch_opts[slot_key] = (ps, torch_make(ps))
            ps, opt = torch_opts[slot_key]
            with torch.no_grad():
                for p, k in zip(ps, names_):
                    p.copy_(c["before"][k][i])  # (the method may move a model between its optimizer's steps)
                    p.grad = c["g"][k][i].clone()
            for group in opt.param_groups:
                group["lr"] = c["lr"]
            opt.step()
            for p, k in zip(ps, names_):
                # float64; one optimizer step of a few ops on numbers ~1: 1e-12 is ~1e4 x the rounding
                torch.testing.assert_close(c["after"][k][i], p.detach(), rtol=1e-12, atol=1e-12,
                                           msg=f"{algo_name} {optim} slot {c['slot']} client {i} entry {k}")


def test_the_replay_catches_an_optimizer_state_dropped_between_steps(monkeypatch):
    """The replay above fails when a method loses its optimizer state between steps (the momentum
    buffer restarted every step), so a pass there means the state was threaded."""
    real = LocalTrainer.descend

    def forgetful(self, local, key, g, lr, rnd, names=None, slot=None, live=None):
        local = local._replace(opt={})
        return real(self, local, key, g, lr, rnd, names, slot, live)

    monkeypatch.setattr(LocalTrainer, "descend", forgetful)
    with pytest.raises(AssertionError):
        test_each_models_optimizer_steps_are_torch_optims_per_client("fedprox", "momentum_wd", monkeypatch)


@pytest.mark.parametrize("algo_name", ["fedavg", "ditto", "fedprox"])
def test_epochs_by_work_equals_the_masked_steps(algo_name):
    """An epochs round computed by work (clients sorted by their steps, only those still training
    computed) gives the masked round's numbers: each client's steps are the same per-client ops."""
    out = {}
    for name, steps in (("by_work", None), ("masked", one_step)):
        algo = build(algo_name, **declared_options(algo_name), local_epochs=2)
        algo = algo.bind(replace(algo.run, optim=LocalOptim(momentum=0.9)))
        torch.manual_seed(0)
        model = MLP(D, K, hidden=[4]).double()
        data = problem()
        sched = Schedule(rounds=2, tau=1, clients_per_round=len(SIZES), batch_size=B)

        def train(a, e, local, d, idx, rnd, aug=None, steps=steps):
            return local_training(a, e, local, d, idx, rnd, aug, step=steps)

        state, _ = simulate(algo, VmapEngine(model), data, params_of(model), sched, 0, steps=train)
        out[name] = state
    for k, v in out["by_work"].params.items():
        torch.testing.assert_close(v, out["masked"].params[k], rtol=1e-12, atol=1e-12)



@pytest.mark.parametrize("algo_name", ["fedprox", "ditto"])
def test_batchnorm_steps_are_torchs_train_mode_per_client(algo_name, monkeypatch):
    """A BatchNorm model's local steps through the trainer: each client's gradient and running
    statistics are those of a torch module in train() on that client's minibatch (batch statistics,
    running ones updated by momentum 0.1, unbiased variance), replayed client by client; the server's
    statistics after the round are the clients' mean (bn=averaged)."""
    from fedrun.models import MLPBN

    seen = []
    real = LocalTrainer.grad

    def spy(self, engine, local, key, x, y):
        g, loss, out = real(self, engine, local, key, x, y)
        seen.append((key, {k: v.clone() for k, v in getattr(local, key).items()}, x.clone(), y.clone(),
                     {k: v.clone() for k, v in g.items()}, {k: v.clone() for k, v in getattr(out, key).items()}))
        return g, loss, out

    monkeypatch.setattr(LocalTrainer, "grad", spy)
    algo = build(algo_name, **declared_options(algo_name))
    torch.manual_seed(0)
    model = MLPBN(D, K, hidden=[4]).double()
    params = params_of(model)
    algo.check_params(params)
    sched = Schedule(rounds=1, tau=2, clients_per_round=len(SIZES), batch_size=B)
    state, _ = simulate(algo, VmapEngine(model), problem(), params, sched, 0)
    assert seen, "no gradient went through the trainer"
    ref = MLPBN(D, K, hidden=[4]).double()
    for key, before, x, y, g, after in seen:
        for i in range(len(x)):
            ref.load_state_dict({k: v[i] for k, v in before.items()})
            ref.train()
            ref.zero_grad()
            torch.nn.functional.cross_entropy(ref(x[i]), y[i]).backward()
            for k, p in ref.named_parameters():
                torch.testing.assert_close(g[k][i], p.grad, rtol=1e-10, atol=1e-12, msg=f"{key} grad {k} client {i}")
            for k, b in ref.named_buffers():
                torch.testing.assert_close(after[k][i], b, rtol=1e-10, atol=1e-12, msg=f"{key} buffer {k} client {i}")
    # the server's running statistics: the trained clients' mean (uniform aggregation, all clients sampled)
    last = {}
    for key, _, _, _, _, after in seen:
        if key == "params":
            last = after
    # (the last step's buffers of the shared model are the round's final ones only when the step that
    # produced them was the round's last; with tau = 2 and one grad per model per step, it is)
    for k in ("net.1.running_mean", "net.1.running_var"):
        torch.testing.assert_close(state.params[k], last[k].mean(0), rtol=1e-10, atol=1e-12)


def test_perfedavg_epochs_cut_each_pass_into_disjoint_meta_step_batches():
    """Per-FedAvg in local epochs: a meta-step's 2 minibatches are disjoint parts of one shuffle of the
    client's rows, floor(n_c / (2 B)) meta-steps a pass (PFLlib's clientperavg: its 2B-row batches cut
    in two); no row comes twice within a pass."""
    from fedrun.simulate import sample_phases

    algo = build("perfedavg", local_epochs=1)
    sizes = torch.tensor([9, 4, 13])
    x, y = torch.randn(26, 3), torch.randint(0, 2, (26,))
    data = FederatedData("t", ClientSplit.from_flat(x, y, sizes, 4), ClientSplit.from_flat(x, y, sizes, 4), 2)
    sched = Schedule(rounds=1, tau=1, clients_per_round=3, batch_size=2)
    _, trained, (d,) = sample_phases(data, sched, algo.phases(), 0, 1)
    assert d.idx.shape[2:] == (2, 2)
    assert d.per_pass.tolist() == (sizes // 4).tolist() == d.live.sum(1).tolist()
    for c in range(3):
        rows = d.idx[c, : int(d.per_pass[c])].flatten().tolist()
        assert len(set(rows)) == len(rows), f"client {c}: a row twice in one pass"
        assert all(data.train.offsets[c] <= r < data.train.offsets[c] + sizes[c] for r in rows)


def test_bind_returns_a_bound_copy_and_leaves_the_options_object_as_it_was():
    """`bind` is the one way a run's facts and recipe reach an algorithm (no setters): the algorithm
    built from its options stays unbound (plain SGD, bn=averaged, tau 1); the copy reads the run."""
    algo = build("fedfomo")
    run = RunInfo(rounds=7, tau=3, optim=LocalOptim(momentum=0.9), bn="local")
    bound = algo.bind(run)
    assert bound is not algo and algo.run == RunInfo() and algo.optim.plain and algo.bn == "averaged"
    assert bound.run is run and bound.optim is run.optim and bound.bn == "local" and bound.tau_steps == 3
    assert algo.phases()[1].steps == 1 and bound.phases()[1].steps == 3  # its training phase: the run's tau
    with pytest.raises(ConfigError) as e:
        algo.bind(RunInfo(bn="shared"))
    assert "\n" not in str(e.value) and "bn" in str(e.value) and "local" in str(e.value)


def test_a_checkpoints_clients_split_into_the_algorithms_and_the_trainers():
    """What a checkpoint holds (`flat_clients`: the names runs wrote before the trainer's state had its
    own field) comes back as it was: the trainer's entries (optimizer slots, bn_local) in
    `ServerState.trainer`, the algorithm's in its own `Clients` type."""
    from fedrun.algorithms.base import flat_clients, state_of
    algo = build("ditto")
    state = algo.init({"w": torch.zeros(2)}, 3)
    state = replace(state, trainer={"opt": {"w": torch.ones(3, 2)}, "opt.personal": {"w": torch.ones(3, 2)},
                                    "bn_local": {"bn.running_mean": torch.zeros(3, 2)}})
    flat = flat_clients(state)
    assert set(flat) == {"personal", "opt", "opt.personal", "bn_local"}
    back = state_of(algo, state.params, state.extra, flat)
    assert set(back.trainer) == {"opt", "opt.personal", "bn_local"}
    assert type(back.clients) is type(state.clients)
    assert flat_clients(back).keys() == flat.keys()
