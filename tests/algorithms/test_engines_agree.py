"""The vmap engine and the per-client loop give the same numbers end to end, for EVERY algorithm the
command line knows (each `algo` config group option, read from Hydra, so a new algorithm cannot miss
this check) and for every value of its choice options (Per-FedAvg's variant, the adaptation of
paper 004's algorithms, pFedMe's train_all).

Each algorithm runs from its own config with the test's hyperparameters merged over it; the setups
(data, model, precision, schedule, tolerances) are the ones each family was checked with before. A
new algorithm gets the strictest one (float64, params and client states within 1e-9) with the
options of its config as they are."""
from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
from helpers import group_options
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedrun.algorithms import names
from fedrun.algorithms.adaptation import ADAPTATIONS
from fedrun.algorithms.base import flat_clients
from fedrun.algorithms.perfedavg import PerFedAvg
from fedrun.bench import agreement
from fedrun.config import CONF_DIR
from fedrun.data import synthetic
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.models import MLP, MLPBN, MLR
from fedrun.simulate import Schedule, simulate


@dataclass(frozen=True, eq=False)  # hashed by identity (data_of caches per setup)
class Setup:
    data: Callable  # () -> FederatedData
    model: Callable  # (data) -> nn.Module, called right after torch.manual_seed(0)
    schedule: dict
    tol: tuple[float, float]  # rtol, atol for server params and client states
    row_tol: tuple[float, float]  # rel, abs for the metrics of every round and the per-client ones
    schedule_axes: dict = field(default_factory=dict)  # {Schedule option: values}, each one a case


def _float64(data):
    data.train.x, data.test.x = data.train.x.double(), data.test.x.double()
    return data


# float32 MLP on 8 synthetic clients: FedAvg and Per-FedAvg, also with test-time minibatches
F32 = Setup(data=lambda: synthetic(num_clients=8, seed=3, cache_dir=None, chunk_len=64),
            model=lambda d: MLP(d.in_features, d.num_classes, hidden=[20]),
            schedule=dict(rounds=3, tau=4, clients_per_round=4, batch_size=10), tol=(1e-4, 1e-5),
            row_tol=(1e-4, 1e-5), schedule_axes={"personalize_batch": [None, 16]})
# float32 MLP on 6 synthetic clients: pFedMe
PFEDME = Setup(data=lambda: synthetic(num_clients=6, seed=2, cache_dir=None, chunk_len=64),
               model=lambda d: MLP(d.in_features, d.num_classes, hidden=[10]),
               schedule=dict(rounds=3, tau=3, clients_per_round=3, batch_size=8), tol=(1e-4, 1e-5),
               row_tol=(1e-4, 1e-5))
# float64 tiny MLP: paper 004's algorithms and any algorithm not listed below; accuracies are
# summed in float32 by the vmap engine's masks, hence the looser metric tolerance
F64 = Setup(data=lambda: _float64(synthetic(num_clients=6, dim=6, num_classes=4, seed=1, cache_dir=None, chunk_len=16)),
            model=lambda d: MLP(6, 4, hidden=[5]).double(),
            schedule=dict(rounds=2, tau=2, clients_per_round=3, batch_size=5), tol=(1e-9, 1e-10),
            row_tol=(1e-6, 1e-7))

# float64 tiny MLP with BatchNorm: FedBN (its per-client BatchNorm parameters and running statistics)
BN64 = Setup(data=F64.data, model=lambda d: MLPBN(6, 4, hidden=[5]).double(), schedule=F64.schedule, tol=F64.tol,
             row_tol=F64.row_tol)

SETUPS = {"fedavg": F32, "perfedavg": F32, "pfedme": PFEDME, "fedbn": BN64}  # others: F64
# float64 tiny MLP on fedrun.bench.agreement's 4 clients of 7-12 rows: the methods whose rounds walk every
# client's rows (F64's clients hold up to 6,552: hundreds of steps a pass)
ROWS64 = Setup(data=lambda: agreement.data_of("mlp", torch.float64, "cpu"),
               model=lambda d: MLP(d.in_features, d.num_classes, hidden=[5]).double(),
               schedule=dict(rounds=2, tau=2, clients_per_round=2, batch_size=4), tol=F64.tol, row_tol=F64.row_tol)
SETUPS.update({name: ROWS64 for name in ("fedpac", "gpfl", "fedcp")})

# Hyperparameters merged over an algorithm's config: fedrun.bench.agreement's (small steps that keep 2-3
# rounds finite, options that exercise code paths the defaults leave idle), pFedMe with 3 inner steps.
OPTIONS = {n: agreement.declared_options(n) for n in names()}
OPTIONS["pfedme"] = dict(OPTIONS["pfedme"], K=3)

# Choice options: an algorithm whose config has one is checked with every allowed value.
CHOICES = {"variant": PerFedAvg.VARIANTS, "adaptation": ADAPTATIONS, "train_all": (False, True)}
# Further code paths, most of them protocol=official's choices: test-time steps on test batches,
# pFedMe's local model served and its mu term, sample-weighted aggregation (a Schedule option),
# first-order MAML, the mean of the clients' models scored.
EXTRA = [
    ("perfedavg", {"test_time": "test_batches"}),
    ("pfedme", {"personalized": "local", "mu": 0.001}),
    ("pfedme", {"aggregate": "samples"}),
    ("fedavg", {"aggregate": "samples"}),
    ("pfldyn", {"adaptation": "maml", "first_order": True}),
    ("pavg", {"adaptation": "maml", "first_order": True}),
    ("pfldyn", {"eval_model": "clients_mean"}),
    ("fedavg", {"finetune_steps": 3}),
    ("fedavg", {"finetune_steps": 3, "personalize_batch": 16}),
    ("apfl", {"alpha_lr": 0.0}),
    ("apfl", {"follow": "pfllib"}),
    ("fedproto", {"follow": "pfllib"}),
]
SCHEDULE_OPTIONS = {"aggregate"}  # besides each setup's schedule_axes


@functools.lru_cache(maxsize=None)
def algo_config(name: str):
    """conf/algo/<name>.yaml, as `algo=<name>` composes it (test_cli composes every one through Hydra;
    reading the file here spares the collection of this module a Hydra composition per algorithm)."""
    return OmegaConf.merge(OmegaConf.load(os.path.join(CONF_DIR, "algo", f"{name}.yaml")), OPTIONS.get(name, {}))


def cases():
    out = []
    for name in group_options("algo"):
        cfg = algo_config(name)
        setup = SETUPS.get(name, F64)
        axes = {k: v for k, v in CHOICES.items() if k in cfg}
        axes.update(setup.schedule_axes)
        for values in itertools.product(*axes.values()):
            opts = dict(zip(axes, values))
            label = "-".join([name, *(f"{k}={v}" for k, v in opts.items())])
            out.append(pytest.param(name, opts, id=label))
    for name, opts in EXTRA:
        out.append(pytest.param(name, opts, id="-".join([name, *(f"{k}={v}" for k, v in opts.items())])))
    return out


@functools.lru_cache(maxsize=None)
def data_of(setup: Setup):
    return setup.data()


def run(setup: Setup, algo, engine_cls, **schedule):
    data = data_of(setup)
    torch.manual_seed(0)
    model = setup.model(data)
    rows = []
    sched = Schedule(**{**setup.schedule, **schedule})
    state, last = simulate(algo, engine_cls(model), data, params_of(model), sched, 0,
                           on_eval=lambda r, t, ev: rows.append(ev.row))
    return state, last, rows


@pytest.mark.parametrize("name,opts", cases())
def test_vmap_and_loop_engines_agree(name, opts):
    setup = SETUPS.get(name, F64)
    in_schedule = SCHEDULE_OPTIONS | set(setup.schedule_axes)
    schedule = {k: v for k, v in opts.items() if k in in_schedule}
    algo_opts = {k: v for k, v in opts.items() if k not in in_schedule}
    cfg = OmegaConf.merge(algo_config(name), algo_opts)
    (sv, ev_v, rows_v), (sl, ev_l, rows_l) = [run(setup, instantiate(cfg), E, **schedule)
                                              for E in (VmapEngine, LoopEngine)]
    rtol, atol = setup.tol
    for k in sv.params:
        torch.testing.assert_close(sv.params[k], sl.params[k], rtol=rtol, atol=atol)
    cv, cl = flat_clients(sv), flat_clients(sl)
    assert cv.keys() == cl.keys()
    for state in cv:  # per-client states (control variates, FedDyn's g_i)
        for k in cv[state]:
            torch.testing.assert_close(cv[state][k], cl[state][k], rtol=rtol, atol=atol)
    rounds = setup.schedule["rounds"]
    assert len(rows_v) == len(rows_l) == rounds
    rel, abs_ = setup.row_tol
    for rv, rl in zip(rows_v, rows_l):
        assert rv.keys() == rl.keys()
        for k in rv:
            assert rv[k] == pytest.approx(rl[k], rel=rel, abs=abs_), k
    assert ev_v.per_client.keys() == ev_l.per_client.keys()
    for k in ev_v.per_client:  # the vmap engine may keep per-client accuracies in float32
        torch.testing.assert_close(ev_v.per_client[k], ev_l.per_client[k], rtol=rel, atol=abs_, check_dtype=False)
    algo = instantiate(cfg)
    if hasattr(algo, "adaptation"):  # paper 004's algorithms serve a personalized model iff they adapt
        assert ("pers_acc" in ev_v.row) == (algo.adaptation != "none")


ARCHS = {"mlp-relu": dict(hidden=[5]), "mlp2-elu": dict(hidden=[5, 4], activation="elu"),
         "mlp2-tanh": dict(hidden=[5, 4], activation="tanh"), "mlp2-sigmoid": dict(hidden=[5, 4], activation="sigmoid"),
         "mlr": None}


@pytest.mark.parametrize("group_rows,max_chunks,arch", [(16, 1024, "mlp-relu"), (10**6, 1024, "mlp-relu")]
                         + [(48, 2, arch) for arch in ARCHS])
def test_full_passes_in_groups_match_the_loop(monkeypatch, group_rows, max_chunks, arch):
    """The vmap engine's full passes over all clients (evaluation with one shared or per-client
    models, the training-loss pass, full-batch gradients, Proto's class sums) give the loop
    engine's numbers whatever the grouping: groups of rows that cut clients in two (a shared
    model's flat blocks, groups of chunks), tiny groups, one group; for MLR and MLPs of one and two
    hidden layers with each activation (the hand-written, class-major passes)."""
    monkeypatch.setattr(VmapEngine, "CPU_GROUP_ROWS", group_rows)
    # size_factor=1: 1,847 training rows in clients of 45-1,310 (the default 5: 9,243, ~5x the passes' work,
    # 32 s for groups of 16 rows); groups of 16 or 48 rows still cut clients in two, many times over
    data = _float64(synthetic(num_clients=6, dim=6, num_classes=4, seed=1, cache_dir=None, chunk_len=16, size_factor=1))
    assert data.train.sizes.max() > 16 and len(data.train.y) > 2 * group_rows or group_rows > 10**5
    torch.manual_seed(0)
    model = (MLR(data.in_features, data.num_classes) if ARCHS[arch] is None
             else MLP(data.in_features, data.num_classes, **ARCHS[arch])).double()
    vm, lp = VmapEngine(model, max_chunks=max_chunks), LoopEngine(model)
    shared = params_of(model)
    C = data.num_clients
    stacked = {k: v.unsqueeze(0) + 0.1 * torch.randn(C, *v.shape, dtype=v.dtype) for k, v in shared.items()}
    for params, is_shared in ((shared, True), (stacked, False)):
        for split in (data.train, data.test):
            for a, b in zip(vm.evaluate(params, split, is_shared), lp.evaluate(params, split, is_shared)):
                torch.testing.assert_close(a.double(), b.double(), rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(vm.loss_sums(params, split, is_shared).double(),
                                       lp.evaluate(params, split, is_shared)[0].double(), rtol=1e-9, atol=1e-9)
        (gv, lv), (gl, ll) = vm.full_grad(params, data.train, is_shared), lp.full_grad(params, data.train, is_shared)
        torch.testing.assert_close(lv, ll, rtol=1e-9, atol=1e-9)
        for k in gv:
            torch.testing.assert_close(gv[k], gl[k], rtol=1e-9, atol=1e-9)
        for a, b in zip(vm.class_sums(params, data.train, is_shared), lp.class_sums(params, data.train, is_shared)):
            if a is not None or b is not None:
                torch.testing.assert_close(a.double(), b.double(), rtol=1e-9, atol=1e-9)
