"""The vmap engine, with every device branch forced in turn (fedrun.branches), against the loop
engine: a few rounds of every algorithm on every model, on any device, in float64 or float32.

The test suite runs it on the CPU (tests/algorithms/test_branches_agree.py) and `fedrun-bench
--gpu-check` on cuda; it needs torch alone (no pytest). Data and models are tiny: 4 synthetic
clients of 7-12 training rows in chunks of 4, MLR and an MLP of one hidden layer on 6 features,
paper 004's CNN on 1x16x16 images, narrowed (16 channels, hidden widths 16 and 12: its layers, passes
and branches; at its 64 channels and widths 384 and 192 its cases took ~3x the CPU); full passes in
groups that cut clients in two (2 chunks under branch groups=rows, 3 under groups=chunks).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch

from ..algorithms import algorithm_class, build, names
from ..algorithms.base import flat_clients
from ..branches import settings
from ..data import ClientSplit, FederatedData
from ..engine import LoopEngine, VmapEngine, params_of
from ..engine.batchnorm import split_buffers
from ..errors import ConfigError
from ..models import CNN, CNNBN, MLP, MLPBN, MLR
from ..simulate import Schedule, simulate

IMAGE = 16  # CNN inputs 1x16x16: the smallest side its two 5x5 convolutions and poolings allow
MODELS = {
    "mlr": lambda d: MLR(d.in_features, d.num_classes),
    "mlp": lambda d: MLP(d.in_features, d.num_classes, hidden=[5]),
    # narrowed, still wide enough that paper 004's clip (AGREEMENT_META's) clips in each of its methods' cases
    "cnn": lambda d: CNN(d.in_features, d.num_classes, in_channels=1, image_size=IMAGE, channels=16, hidden=(16, 12)),
    "mlp_bn": lambda d: MLPBN(d.in_features, d.num_classes, hidden=[5]),
    "cnn_bn": lambda d: CNNBN(d.in_features, d.num_classes, in_channels=1, image_size=IMAGE),
}
# Models the CPU test suite leaves out (the CNN with BatchNorm: ~20 s of CPU for its 4 cases); the GPU
# check runs them, and `python -c "from fedrun import agreement; ..."` on the CPU (docs/baselines.md).
SUITE_SKIPS = {"cnn_bn"}
SHAPES = {"mlr": (6,), "mlp": (6,), "cnn": (1, IMAGE, IMAGE), "mlp_bn": (6,), "cnn_bn": (1, IMAGE, IMAGE)}
TRAIN, TEST, CLASSES, CHUNK = (10, 7, 12, 9), (4, 3, 5, 2), 3, 4
MAX_CHUNKS, GROUP_ROWS = 3, 8  # the vmap engine's groups: 3 chunks (groups=chunks), 8 rows = 2 chunks (rows)



def declared_options(algo: str) -> dict:
    """The options the agreement runs `algo` with over its yaml's: those its class declares itself
    (`agreement_options`, not inherited: small steps that keep the rounds finite, options that use
    code paths the defaults leave idle, e.g. a clip that clips, a decaying lr)."""
    return dict(vars(algorithm_class(algo)).get("agreement_options", {}))


def variants(algo: str, batchnorm: bool) -> list[dict]:
    """Besides `algo` at its options, the variants its class declares (`agreement_variants`: the
    other engine primitives' users, e.g. Per-FedAvg's HVPs, Proto adaptation) and, on a model with
    BatchNorm, the options it runs there with (`agreement_batchnorm`, where its defaults are refused)."""
    cls = vars(algorithm_class(algo))
    out = [dict(v) for v in cls.get("agreement_variants", ())]
    if batchnorm and "agreement_batchnorm" in cls:
        out.append(dict(cls["agreement_batchnorm"]))
    return out


SCHEDULE = dict(rounds=2, tau=2, clients_per_round=2, batch_size=4)
TOL = {torch.float64: (1e-9, 1e-10), torch.float32: (1e-4, 1e-5)}  # rtol, atol of params and client states
# of the logged metrics: the vmap engine sums accuracies with float32 row masks
METRIC_TOL = {torch.float64: (1e-6, 1e-7), torch.float32: (1e-4, 1e-5)}


@dataclass(frozen=True)
class Case:
    model: str
    algo: str
    options: tuple  # ((name, value), ...) over OPTIONS[algo]
    paths: tuple  # ((branch, value), ...) forced on the vmap engine

    @property
    def id(self) -> str:
        parts = [self.model, self.algo, *(f"{k}={v}" for k, v in self.options)]
        return "-".join(parts) + "-" + (",".join(f"{k}={v}" for k, v in self.paths) or "defaults")


def algo_cases(model: str) -> list[tuple[str, dict]]:
    """Every algorithm conf/algo knows (read there, so a new one is checked), then the variants the
    algorithms declare; on each model those it serves: on MLR not those adapting by Proto (MLR has
    no hidden layer: Proto's features would be the inputs) nor those splitting the model into body
    and head (MLR is a head alone; they refuse it); on the BatchNorm models the algorithms that
    handle BatchNorm, on the others not FedBN (both refuse)."""
    state = params_of(MODELS[model](data_of(model, torch.float64, "cpu")))
    batchnorm = bool(split_buffers(state)[1])
    out = [(a, {}) for a in names()] + [(a, v) for a in names() for v in variants(a, batchnorm)]
    return [(a, o) for a, o in out if _serves(_probe(a, tuple(o.items())), state, model)]


@functools.lru_cache(maxsize=None)
def _probe(algo: str, options: tuple):
    """`algo` built at its agreement options and `options`, once (not once a model and path setting:
    each worker of the test suite lists the cases when it collects them): `_serves` asks it, `_run`
    runs a copy of it."""
    return build(algo, **{**declared_options(algo), **dict(options)})


def _serves(algo, params, model: str) -> bool:
    """Whether `algo` runs on a model with these params (Proto needs a hidden layer; the body/head
    splits refuse a model that is a head alone; BatchNorm models need an algorithm that handles
    their buffers, FedBN a model with them)."""
    if getattr(algo, "adaptation", "") == "proto" and model == "mlr":
        return False
    try:
        algo.check_params(params)
    except ConfigError:
        return False
    return True


def cases(device: str | torch.device = "cpu") -> list[Case]:
    """Every model x every path setting that changes something for it on `device` x every algorithm."""
    out = []
    for model in MODELS:
        probe = MODELS[model](data_of(model, torch.float64, "cpu"))
        served = algo_cases(model)
        for paths in settings(probe, device):
            for algo, opts in served:
                out.append(Case(model, algo, tuple(opts.items()), tuple(paths.items())))
    return out


@functools.lru_cache(maxsize=None)
def _cpu_data(model: str) -> FederatedData:
    """Gaussian features, labels of a random linear teacher plus each client's own label shift."""
    g = torch.Generator().manual_seed(1)
    shape = SHAPES[model]
    teacher = torch.randn(CLASSES, *shape, generator=g, dtype=torch.float64)

    def split(sizes) -> ClientSplit:
        x = torch.randn(sum(sizes), *shape, generator=g, dtype=torch.float64)
        owner = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
        y = ((x.flatten(1) @ teacher.flatten(1).T).argmax(1) + owner) % CLASSES
        return ClientSplit.from_flat(x, y, torch.tensor(sizes), CHUNK)

    return FederatedData(f"agreement_{model}", split(TRAIN), split(TEST), CLASSES)


def data_of(model: str, dtype: torch.dtype, device):
    data = _cpu_data(model).to(device)
    data.train.x, data.test.x = data.train.x.to(dtype), data.test.x.to(dtype)
    return data


def _run(model_name: str, algo_name: str, options: tuple, paths: tuple | None, device: str, dtype: torch.dtype):
    """The final state, last evaluation and logged rows of the vmap engine with `paths` forced (None:
    of the loop engine)."""
    data = data_of(model_name, dtype, device)
    torch.manual_seed(0)
    model = MODELS[model_name](data).to(device=device, dtype=dtype)
    if paths is None:
        eng = LoopEngine(model)
    else:
        eng = VmapEngine(model, max_chunks=MAX_CHUNKS, paths=dict(paths))
        eng.CPU_GROUP_ROWS = GROUP_ROWS
    algo = copy.deepcopy(_probe(algo_name, options))  # (a copy of one build: its Hydra instantiation costs 100x)
    rows = []
    state, last = simulate(algo, eng, data, params_of(model), Schedule(**SCHEDULE), 0,
                           on_eval=lambda r, t, ev: rows.append(ev.row))
    return state, last, rows


@functools.lru_cache(maxsize=64)
def _loop_run(model_name: str, algo_name: str, options: tuple, device: str, dtype: torch.dtype):
    """The loop engine's run: the reference every path setting is compared with, computed once."""
    return _run(model_name, algo_name, options, None, device, dtype)


def run_case(case: Case, device="cpu", dtype=torch.float64) -> dict:
    """Runs `case` on both engines. Returns {"max_err": largest |vmap - loop| over the final params,
    client states, every round's metrics and the per-client ones, "ok": whether all of them are
    within TOL[dtype] (METRIC_TOL for metrics; per element: |a - b| <= atol + rtol |b|), "worst": the quantity furthest
    out (in units of its tolerance)}."""
    (sv, ev_v, rows_v) = _run(case.model, case.algo, case.options, case.paths, str(device), dtype)
    (sl, ev_l, rows_l) = _loop_run(case.model, case.algo, case.options, str(device), dtype)
    pairs = [(f"params.{k}", sv.params[k], sl.params[k], TOL[dtype]) for k in sv.params]
    bv, bl = sv.extra.get("buffers", {}), sl.extra.get("buffers", {})
    if bv.keys() != bl.keys():
        raise AssertionError(f"{case.id}: server buffers {sorted(bv)} vs {sorted(bl)}")
    pairs += [(f"buffers.{k}", bv[k], bl[k], TOL[dtype]) for k in bv]  # a BatchNorm model's running statistics
    cv, cl = flat_clients(sv), flat_clients(sl)
    if cv.keys() != cl.keys():
        raise AssertionError(f"{case.id}: client states {sorted(cv)} vs {sorted(cl)}")
    pairs += [(f"clients.{s}.{k}", cv[s][k], cl[s][k], TOL[dtype]) for s in cv for k in cv[s]]
    if len(rows_v) != len(rows_l) or any(a.keys() != b.keys() for a, b in zip(rows_v, rows_l)):
        raise AssertionError(f"{case.id}: the engines logged different rows")
    pairs += [(f"round{i + 1}.{k}", torch.tensor(a[k], dtype=torch.float64), torch.tensor(b[k], dtype=torch.float64),
               METRIC_TOL[dtype]) for i, (a, b) in enumerate(zip(rows_v, rows_l)) for k in a]
    pairs += [(f"per_client.{k}", ev_v.per_client[k], ev_l.per_client[k], METRIC_TOL[dtype]) for k in ev_v.per_client]
    max_err, worst, worst_ratio = 0.0, None, 0.0
    for name, a, b, (rtol, atol) in pairs:
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        if a.shape != b.shape:
            raise AssertionError(f"{case.id}: {name} has shape {tuple(a.shape)} vs {tuple(b.shape)}")
        fin = torch.isfinite(a)
        same_nonfinite = torch.equal(fin, torch.isfinite(b)) and torch.equal(a[~fin].nan_to_num(), b[~fin].nan_to_num())
        diff = torch.where(fin, (a - b).abs(), torch.zeros_like(a)) if same_nonfinite else torch.full_like(a, torch.inf)
        max_err = max(max_err, float(diff.max()) if diff.numel() else 0.0)
        ratio = float((diff / (atol + rtol * b.abs().nan_to_num())).max()) if diff.numel() else 0.0
        if ratio > worst_ratio:
            worst, worst_ratio = name, ratio
    return {"max_err": max_err, "ok": worst_ratio <= 1.0, "worst": worst, "ratio": worst_ratio}
