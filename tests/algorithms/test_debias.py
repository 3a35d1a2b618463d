"""Paper 004's algorithms and adaptations against hand-computed numbers; engines agree end to end;
configs and presets compose; a 2-round CLI run of a preset writes its metrics."""
import dataclasses

import pandas as pd
import pytest
import torch
from helpers import fedrun, half_squared, quad_grad, quadratic_setup, write_cifar
from helpers import group_options as options
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import nn

from fedrun.algorithms.adaptation import MAML, Proto
from fedrun.algorithms.feddyn import FedDyn
from fedrun.algorithms.pavg import PAvg
from fedrun.algorithms.pfldyn import PFLDyn
from fedrun.algorithms.pflscaf import PFLScaf
from fedrun.algorithms.scaffold import Scaffold
from fedrun.config import CONF_DIR
from fedrun.data import ClientSplit, cifar, synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.engine.proto import class_means, proto_logits
from fedrun.errors import ConfigError
from fedrun.models import CNN, MLP
from fedrun.run.checks import precheck
from fedrun.simulate import Schedule, local_training, sample_round, simulate

ENGINES = [VmapEngine, LoopEngine]


# ----------------------------------------------------------------------------------------------
# adaptations
# ----------------------------------------------------------------------------------------------

def test_proto_logits_hand_built():
    feats = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 2, 2])
    centers, present = class_means(feats, y, 3)
    torch.testing.assert_close(centers, torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0]]))
    assert present.tolist() == [True, False, True]
    q = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    logits = proto_logits(q, centers, present)
    # -||q - c||^2: (1,1) to (1,0): 1, to (0,3): 1 + 4 = 5; (0,0) to (1,0): 1, to (0,3): 9
    assert logits[:, 1].isinf().all() and (logits[:, 1] < 0).all()  # class 1 has no support rows
    torch.testing.assert_close(logits[:, [0, 2]], torch.tensor([[-1.0, -5.0], [-1.0, -9.0]]))


class Features(nn.Module):
    """forward(x, features=True) = x @ A: a model whose Proto features are known by hand."""

    num_classes = 3

    def __init__(self):
        super().__init__()
        self.A = nn.Parameter(torch.eye(2, dtype=torch.float64))
        self.head = nn.Linear(2, 3).double()

    def forward(self, x, features=False):
        h = x @ self.A
        return h if features else self.head(h)


@pytest.mark.parametrize("E", ENGINES)
def test_proto_meta_loss_and_test_time_prototypes(E):
    model = Features()
    engine = E(model)
    p = params_of(model)
    xs = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [0.0, 2.0]], dtype=torch.float64)
    ys = torch.tensor([0, 0, 2, 2])
    xq = torch.tensor([[1.0, 1.0], [0.0, 0.0], [5.0, 5.0]], dtype=torch.float64)
    yq = torch.tensor([0, 2, 1])  # the last row's class has no prototype: left out of the mean
    _, loss = engine.value_and_grad(Proto().meta_loss(engine), {k: v[None] for k, v in p.items()},
                                    xs[None], ys[None], xq[None], yq[None])
    logits = torch.tensor([[-1.0, -5.0], [-1.0, -9.0]], dtype=torch.float64)
    expected = (-torch.log_softmax(logits, -1)[0, 0] - torch.log_softmax(logits, -1)[1, 1]) / 2
    torch.testing.assert_close(loss[0], expected)
    # test time: prototypes from ALL training rows of each client, missing classes masked
    from fedrun.data.federated import ClientSplit
    split = ClientSplit.from_flat(torch.cat([xs, xq]), torch.cat([ys, torch.tensor([0, 0, 1])]),
                                  torch.tensor([4, 3]), chunk_len=2)
    served, _ = Proto().personalize(engine, p, split)
    torch.testing.assert_close(served.centers[0],
                               torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0]], dtype=torch.float64))
    torch.testing.assert_close(served.centers[1],
                               torch.tensor([[0.5, 0.5], [5.0, 5.0], [0.0, 0.0]], dtype=torch.float64))
    assert served.present.tolist() == [[True, False, True], [True, True, False]]
    _, correct = engine.evaluate(p, split, True, served.centers, served.present)
    # client 0: (0,0) and (2,0) nearest c0=(1,0); (0,4) and (0,2) nearest c2=(0,3): all 4 right;
    # client 1: c0=(.5,.5), c1=(5,5): (1,1), (0,0) -> 0 and (5,5) -> 1: all 3 right
    assert correct.tolist() == [4.0, 3.0]


@pytest.mark.parametrize("E", ENGINES)
@pytest.mark.parametrize("model_fn", [lambda: MLP(6, 4, hidden=[5]).double(), lambda: Features4()],
                         ids=["features_and_logits", "features_only"])
def test_proto_train_loss_from_the_prototype_pass(tiny, E, model_fn):
    """Proto's test-time pass over all training rows also gives the shared model's training loss
    (fedrun's models return features and logits at once); it equals a separate evaluation pass.
    A model that returns only features gives None, and evaluation makes that pass itself."""
    data, _ = tiny
    torch.manual_seed(0)
    model = model_fn()
    engine = E(model)
    p = params_of(model)
    served, train_loss = Proto().personalize(engine, p, data.train)
    loss_sum, _ = engine.evaluate(p, data.train, True)
    if isinstance(model, Features4):
        assert train_loss is None
    else:
        torch.testing.assert_close(train_loss, loss_sum / data.train.sizes.double(), rtol=1e-12, atol=0)
    sums, counts, _ = engine.class_sums(p, data.train, True)
    torch.testing.assert_close(served.centers, sums / counts.clamp(min=1).unsqueeze(-1))


class Features4(Features):
    """Features' forward (features only, no features="both") on 6 inputs and 4 classes."""

    num_classes = 4

    def __init__(self):
        super().__init__()
        self.A = nn.Parameter(torch.randn(6, 3, dtype=torch.float64))
        self.head = nn.Linear(3, 4).double()


@pytest.mark.parametrize("E", ENGINES)
@pytest.mark.parametrize("first_order", [False, True])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_maml_meta_gradient_on_quadratic(E, first_order, steps):
    """k inner steps of a on D, loss on D': the gradient is prod_k (I - a H_D) g_D'(w_k) exactly,
    and g_D'(w_k) alone when first_order drops the Hessian terms."""
    model, params, batches = quadratic_setup()
    a = 0.3
    engine = E(model, criterion=half_squared)
    maml = MAML(inner_lr=a, inner_steps=steps, first_order=first_order)
    (xs, ys), (xq, yq) = batches[:2]
    g, _ = engine.value_and_grad(maml.meta_loss(engine), params, xs, ys, xq, yq)
    for i in range(len(xs)):
        w = params["weight"][i, 0]
        for _ in range(steps):
            w = w - a * quad_grad(w, xs[i], ys[i])
        expected = quad_grad(w, xq[i], yq[i])
        if not first_order:
            J = torch.eye(len(w), dtype=w.dtype) - a * xs[i].T @ xs[i] / len(ys[i])
            expected = torch.linalg.matrix_power(J, steps) @ expected
        torch.testing.assert_close(g["weight"][i, 0], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("E", ENGINES)
@pytest.mark.parametrize("test_steps", [None, 3])
def test_maml_test_time_steps_on_quadratic(E, test_steps):
    """MAML's personalization: `test_steps` (null: inner_steps) full-batch GD steps of inner_lr
    from the shared model on each client's training rows, by hand."""
    model, params, batches = quadratic_setup(m=3, B=5)
    x, y = batches[0]
    split = ClientSplit.from_flat(x.reshape(-1, x.shape[-1]), y.reshape(-1), torch.tensor([5, 5, 5]), chunk_len=2)
    split.y = y.reshape(-1)  # real-valued targets of the quadratic (from_flat stores class labels)
    a, shared = 0.2, {"weight": params["weight"][0]}
    maml = MAML(inner_lr=a, inner_steps=5, test_steps=test_steps)
    adapted, loss = maml.personalize(E(model, criterion=half_squared), shared, split)
    for i in range(3):
        w = shared["weight"][0]
        torch.testing.assert_close(loss[i], half_squared(x[i] @ w, y[i]), rtol=1e-12, atol=1e-12)
        for _ in range(test_steps or 5):
            w = w - a * quad_grad(w, x[i], y[i])
        torch.testing.assert_close(adapted["weight"][i, 0], w, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# algorithms on toy problems
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    data = synthetic(num_clients=6, dim=6, num_classes=4, seed=1, chunk_len=16)
    data.train.x, data.test.x = data.train.x.double(), data.test.x.double()
    torch.manual_seed(0)
    return data, MLP(6, 4, hidden=[5]).double()


@pytest.mark.parametrize("adaptation", ["maml", "proto"])
def test_pfldyn_with_vanishing_alpha_trains_like_pavg(tiny, adaptation):
    """With g_i = 0 (first round) and alpha -> 0 the PFLDyn regularizer vanishes: same local models."""
    data, model = tiny
    sched = Schedule(rounds=1, tau=3, clients_per_round=3, batch_size=5)
    opts = dict(lr=0.1, adaptation=adaptation, inner_lr=0.05, inner_steps=2, weight_decay=0.01, clip=1.0)
    engine = VmapEngine(model)
    out = []
    for algo in (PFLDyn(alpha=1e-12, **opts), PAvg(**opts)):
        _, trained, idx = sample_round(data, sched, algo.batches_per_step, 0, 1)
        state = algo.init(params_of(model), data.num_clients)
        out.append(local_training(algo, engine, algo.client_init(state, trained, 1), data, idx, 1).params)
    head = {"net.2.weight", "net.2.bias"} if adaptation == "proto" else set()
    for k in out[0]:
        if k in head:  # Proto never uses the output layer: only PFLDyn's regularizer touches it, so
            # only PFLDyn weight-decays it (as torch SGD skips parameters without a gradient)
            w0 = params_of(model)[k]
            torch.testing.assert_close(out[1][k], w0.expand_as(out[1][k]))
            torch.testing.assert_close(out[0][k], (w0 * (1 - 0.1 * 0.01) ** 3).expand_as(out[0][k]), rtol=1e-9,
                                       atol=1e-10)
        else:
            torch.testing.assert_close(out[0][k], out[1][k], rtol=1e-9, atol=1e-10)


def test_scaffold_control_variates_on_quadratic():
    """Two rounds of SCAFFOLD (option II) on quadratics, 3 clients, 2 sampled per round, by hand."""
    model, params, batches = quadratic_setup(m=3)
    (x, y) = batches[0]
    engine = VmapEngine(model, criterion=half_squared)
    lr, K, C = 0.1, 2, 3
    algo = Scaffold(lr=lr, lr_decay=1.0, weight_decay=0.0, clip=None)  # plain SGD, as the reference below
    w0 = params["weight"][0]
    state = algo.init({"weight": w0}, C)
    # reference
    w, c, ci = w0[0].clone(), torch.zeros(4, dtype=torch.float64), torch.zeros(C, 4, dtype=torch.float64)
    for rnd, sampled in ((1, [0, 2]), (2, [1, 2])):
        ids = torch.tensor(sampled)
        local = algo.client_init(state, ids, rnd)
        for _ in range(K):  # full-batch steps on each client's fixed rows
            local = algo.client_step(engine, local, [(x[ids], y[ids])], rnd)
        state = algo.server_update(state, local, ids, torch.arange(len(ids)), None)
        ys, new_ci = [], ci.clone()
        for i in sampled:
            v = w.clone()
            for _ in range(K):
                v = v - lr * (quad_grad(v, x[i], y[i]) + c - ci[i])
            ys.append(v)
            new_ci[i] = ci[i] - c + (w - v) / (K * lr)
        c = c + (new_ci - ci).sum(0) / C
        ci, w = new_ci, torch.stack(ys).mean(0)
        torch.testing.assert_close(state.params["weight"][0], w)
        torch.testing.assert_close(state.extra["c"]["weight"][0], c)
        torch.testing.assert_close(state.clients.c["weight"][:, 0], ci)
    assert ci[0].abs().sum() > 0 and ci[1].abs().sum() > 0  # both rounds really changed the states


def test_feddyn_state_on_quadratic_and_unsampled_clients_keep_theirs():
    """One FedDyn round by hand (Alg. 2 PFLDyn: g_i update; Update_1), then a round that samples other
    clients leaves the first ones' g_i unchanged."""
    model, params, batches = quadratic_setup(m=3)
    (x, y) = batches[0]
    engine = VmapEngine(model, criterion=half_squared)
    lr, alpha, C = 0.1, 0.5, 3
    algo = FedDyn(alpha=alpha, lr=lr, lr_decay=1.0, weight_decay=0.0, clip=None)  # plain SGD, as the reference
    w0 = params["weight"][0]
    state = algo.init({"weight": w0}, C)
    ids = torch.tensor([0, 1])
    local = algo.client_init(state, ids, 1)
    for _ in range(2):
        local = algo.client_step(engine, local, [(x[ids], y[ids])], 1)
    state = algo.server_update(state, local, ids, torch.arange(2), None)
    ws = []
    for i in (0, 1):
        v = w0[0].clone()
        for _ in range(2):
            v = v - lr * (quad_grad(v, x[i], y[i]) + alpha * (v - w0[0]))  # g_i = 0 in round 1
        ws.append(v)
    ws = torch.stack(ws)
    g = -alpha * (ws - w0[0])
    h = -alpha / C * (ws - w0[0]).sum(0)
    torch.testing.assert_close(state.clients.g["weight"][:2, 0], g)
    assert state.clients.g["weight"][2].abs().sum() == 0
    torch.testing.assert_close(state.params["weight"][0], ws.mean(0) - h / alpha)
    before = state.clients.g["weight"].clone()
    ids = torch.tensor([2])
    local = algo.client_step(engine, algo.client_init(state, ids, 2), [(x[ids], y[ids])], 2)
    state = algo.server_update(state, local, ids, torch.arange(1), None)
    torch.testing.assert_close(state.clients.g["weight"][:2], before[:2])  # stale devices frozen
    assert not torch.equal(state.clients.g["weight"][2], before[2])


def test_pflscaf_counts_two_models_per_client_and_round(tiny):
    data, model = tiny
    seen = []
    sched = Schedule(rounds=3, tau=1, clients_per_round=2, batch_size=4)
    simulate(PFLScaf(adaptation="proto"), VmapEngine(model), data, params_of(model), sched, 0,
             on_eval=lambda rnd, t, ev: seen.append(t))
    assert seen == [4, 8, 12]
    seen.clear()
    simulate(PFLDyn(adaptation="proto"), VmapEngine(model), data, params_of(model), sched, 0,
             on_eval=lambda rnd, t, ev: seen.append(t))
    assert seen == [2, 4, 6]


# vmap vs loop end to end for every algorithm and adaptation: test_engines_agree.py


def test_first_and_second_order_maml_differ_end_to_end(tiny):
    data, model = tiny
    sched = Schedule(rounds=1, tau=2, clients_per_round=3, batch_size=5)
    s = [simulate(PFLDyn(adaptation="maml", inner_lr=0.5, first_order=fo), VmapEngine(model), data,
                  params_of(model), sched, 0)[0] for fo in (False, True)]
    assert not torch.allclose(s[0].params["net.0.weight"], s[1].params["net.0.weight"])


def test_state_resumes_to_the_same_numbers(tiny):
    """A run cut after round 1 and resumed from its Progress (what checkpoints hold) repeats exactly."""
    data, model = tiny
    algo = PFLScaf(adaptation="maml", inner_steps=1)
    full, _ = simulate(algo, VmapEngine(model), data, params_of(model), Schedule(2, 2, 3, 5), 0)
    saved = []
    simulate(algo, VmapEngine(model), data, params_of(model), Schedule(1, 2, 3, 5), 0, on_checkpoint=saved.append)
    resumed, _ = simulate(algo, VmapEngine(model), data, params_of(model), Schedule(2, 2, 3, 5), 0, start=saved[-1])
    for k in full.params:
        torch.testing.assert_close(full.params[k], resumed.params[k], rtol=0, atol=0)
        torch.testing.assert_close(full.clients.c[k], resumed.clients.c[k], rtol=0, atol=0)


@pytest.mark.parametrize("bad,option", [
    (dict(lr=0), "algo.lr"), (dict(lr_decay=-1), "algo.lr_decay"), (dict(weight_decay=-0.1), "algo.weight_decay"),
    (dict(clip=-1), "algo.clip"), (dict(adaptation="reptile"), "algo.adaptation"), (dict(inner_lr=0), "algo.inner_lr"),
    (dict(inner_steps=0), "algo.inner_steps"), (dict(first_order="yes"), "algo.first_order"),
    (dict(test_steps=0), "algo.test_steps"), (dict(alpha=0), "algo.alpha"),
    (dict(eval_model="best"), "algo.eval_model"),
])
def test_bad_options_are_one_line_naming_the_option(bad, option):
    with pytest.raises(ConfigError) as e:
        PFLDyn(**bad)
    assert str(e.value).startswith(option) and "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        PAvg(proto_first_step_only="yes")
    assert str(e.value).startswith("algo.proto_first_step_only") and "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------
# CIFAR-format data, CNN, configs, CLI
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def c10(tmp_path_factory):
    root = tmp_path_factory.mktemp("c10")
    write_cifar(str(root), 10, 8, 4)
    return str(root)


def test_pfldyn_proto_on_tiny_cifar_cnn_with_augmentation_engines_agree(c10):
    data = cifar(root=c10, num_clients=10, classes_per_client=2, download=False, cache_dir=None, chunk_len=8)
    assert data.augment == "crop_flip"
    torch.manual_seed(0)
    model = CNN(data.in_features, data.num_classes)
    sched = Schedule(rounds=1, tau=2, clients_per_round=2, batch_size=3)
    run = lambda E, d: simulate(PFLDyn(adaptation="proto", clip=10, weight_decay=1e-3), E(model), d, params_of(model),
                                sched, 0)
    out = [run(E, data) for E in ENGINES]
    for k in out[0][0].params:
        torch.testing.assert_close(out[0][0].params[k], out[1][0].params[k], rtol=1e-4, atol=1e-5)
    assert out[0][1].row["pers_acc"] == pytest.approx(out[1][1].row["pers_acc"], abs=1e-6)
    # the padding's fill (data.pad_fill=black) reaches the training batches: 0 instead trains otherwise
    assert data.augment_fill is not None
    mean_pad = run(VmapEngine, dataclasses.replace(data, augment_fill=None))[0].params
    assert any((mean_pad[k] - out[0][0].params[k]).abs().max() > 1e-4 for k in mean_pad)


@pytest.mark.parametrize("algo", ["pfldyn", "pflscaf", "pavg", "feddyn", "scaffold"])
def test_algo_configs_compose_and_instantiate(algo):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"algo={algo}"])
    a = instantiate(cfg.algo)
    assert a.name == algo and a.lr == 0.1 and a.lr_decay == 0.997 and a.weight_decay == 0.001 and a.clip == 10


PRESETS = {  # preset -> (algorithm, adaptation, {option: value})
    "pfldyn_proto": ("pfldyn", "proto", {"alpha": 0.1}),
    "pfldyn_maml": ("pfldyn", "maml", {"alpha": 0.01, "inner_steps": 5}),
    "pflscaf_proto": ("pflscaf", "proto", {}),
    "pflscaf_maml": ("pflscaf", "maml", {"inner_steps": 1}),
    "pavg_proto": ("pavg", "proto", {}),
    "perfedavg_maml": ("pavg", "maml", {"inner_steps": 5}),
    "feddyn": ("feddyn", "none", {}),
    "scaffold": ("scaffold", "none", {}),
}


def test_every_preset_is_tested():
    ours = [e for e in options("experiment") if e.startswith("cifar")]
    assert ours == sorted(f"cifar10_acid5_{k}" for k in PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_compose_and_instantiate(name):
    algo, adaptation, opts = PRESETS[name]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment=cifar10_acid5_{name}", "rounds=7"], return_hydra_config=True)
    assert cfg.hydra.runtime.choices.algo == algo and cfg.hydra.runtime.choices.data == "cifar10_acid"
    assert (cfg.rounds, cfg.tau, cfg.batch_size, cfg.frac) == (7, 50, 50, 0.1)  # the command line wins
    assert cfg.data.classes_per_client == 5 and cfg.model._target_.endswith("CNN")
    a = instantiate(cfg.algo)
    assert a.name == algo and a.adapt.name == adaptation
    for k, v in opts.items():
        assert cfg.algo[k] == v


def test_precheck_knows_presets():
    msg = precheck(["experiment=nope"])
    assert "cifar10_acid5_pfldyn_proto" in msg and "\n" not in msg
    assert precheck(["experiment=cifar10_acid5_pfldyn_proto", "algo.alpha=0.3"]) is None  # pfldyn's option
    assert "algo=pavg" in precheck(["experiment=cifar10_acid5_pavg_proto", "algo.alpha=0.3"])


def test_cli_runs_a_preset_for_two_rounds(c10, tmp_path):
    args = ["experiment=cifar10_acid5_pflscaf_proto", f"data.root={c10}", "data.download=false", "data.num_clients=10",
            "data.classes_per_client=2", "rounds=2", "tau=2", "batch_size=3", "frac=0.2", "progress=false",
            "plot=false", f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"]
    p = fedrun(args, tmp_path)
    assert p.returncode == 0, p.stderr
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert m["round"].tolist() == [1, 2] and m["models_transmitted"].tolist() == [4, 8]
    assert {"pers_acc", "global_acc", "train_loss"} <= set(m.columns)


def test_maml_personalization_on_minibatches_when_asked(tiny):
    """personalize_batch=N: the MAML test-time steps use minibatches of TRAINING rows (one per step)."""
    data, model = tiny
    sched = Schedule(rounds=1, tau=1, clients_per_round=2, batch_size=4, personalize_batch=3)
    rows = [simulate(PAvg(adaptation="maml", test_steps=2), E(model), data, params_of(model), sched, 0)[1].row
            for E in ENGINES]
    assert rows[0]["pers_acc"] == pytest.approx(rows[1]["pers_acc"], abs=1e-6)
    full = simulate(PAvg(adaptation="maml", test_steps=2), VmapEngine(model), data, params_of(model),
                    Schedule(rounds=1, tau=1, clients_per_round=2, batch_size=4), 0)[1].row
    assert full["pers_loss"] != rows[0]["pers_loss"]
