"""Every algorithm under the recipe today's papers train with (issue 44): {no norm, BatchNorm,
GroupNorm} x {sgd, momentum + weight decay, adam} x {steps, epochs} x {unseen clients or not}, in a
pairwise design (every pair of values of any two factors, the algorithm included, in some cell; not
the full product). Each cell is one round of one local step (or one epoch of each client's rows) on
the tiniest data, a ResNet-10 of width 2 on 1x4x4 images in float64, under both engines: it runs, and
vmap = loop, or it is refused in one line, and the refusals are pinned here (REFUSED) and listed in
docs/baselines.md ("Which methods take which recipe")."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from fedrun.algorithms import algorithm_class, build, names
from fedrun.algorithms.optim import PLAIN, LocalOptim
from fedrun.algorithms.options import signature_options
from fedrun.bench.agreement import declared_options
from fedrun.data import ClientSplit, FederatedData
from fedrun.engine import LoopEngine, VmapEngine, params_of
from fedrun.errors import ConfigError
from fedrun.models import ResNet10
from fedrun.simulate import Schedule, simulate

NORMS = ("none", "bn", "gn")
OPTIMS = {"sgd": PLAIN, "momentum_wd": LocalOptim(momentum=0.9, weight_decay=5e-4), "adam": LocalOptim(name="adam")}
UNITS = ("steps", "epochs")
UNSEEN = (False, True)
ALGOS = tuple(names())
SIDE, CLASSES, B = 4, 3, 2
TRAIN_SIZES = (6, 4, 2)  # uneven clients: 3, 2 and 1 minibatches an epoch
# float64; a round of a few dozen ops per number, each rounding by eps64 ~ 1.1e-16 of numbers below
# ~10 (the ResNet's activations at width 2), a few hundred ops deep at most: 1e-9 is 1e3 x above any
# rounding difference and far below any step's effect (lr x gradient ~ 1e-3)
TOL = dict(rtol=1e-9, atol=1e-10)


def design() -> list[tuple]:
    """The cells: for algorithm i, three rows j = 0, 1, 2 with norm j, optimizer (i + j) mod 3, the
    unit (i + j) mod 2 and unseen clients (i // 2 + j) mod 2; `test_the_design_covers_every_pair`
    checks that every pair of values of two factors meets in some cell."""
    opts = list(OPTIMS)
    return [(a, NORMS[j], opts[(i + j) % 3], UNITS[(i + j) % 2], UNSEEN[(i // 2 + j) % 2])
            for i, a in enumerate(ALGOS) for j in range(3)]


CELLS = design()

# (algorithm, factor value) -> the words of its one-line refusal, for every refused cell (a refusal
# holds for every cell with that value). Kept in step with docs/baselines.md.
REFUSED: dict[tuple[str, str], str] = {
    ("pavg", "bn"): "algo=pavg with algo.adaptation=maml does not handle BatchNorm",  # second order through batch stats
    ("pflscaf", "bn"): "algo=pflscaf with algo.adaptation=maml does not handle BatchNorm",  # (the same)
    ("fedbn", "none"): "algo=fedbn keeps the model's BatchNorm layers local, but this model has none",
    ("fedbn", "gn"): "algo=fedbn keeps the model's BatchNorm layers local, but this model has none",
}


def test_the_design_covers_every_pair():
    factors = [ALGOS, NORMS, tuple(OPTIMS), UNITS, UNSEEN]
    for (i, fi), (j, fj) in itertools.combinations(enumerate(factors), 2):
        seen = {(c[i], c[j]) for c in CELLS}
        missing = [p for p in itertools.product(fi, fj) if p not in seen]
        assert not missing, f"factors {i} and {j}: pairs never in a cell: {missing[:5]}"


def problem(unseen: bool):
    g = torch.Generator().manual_seed(7)
    sizes = torch.tensor(TRAIN_SIZES + ((2,) if unseen else ()))
    n = int(sizes.sum())
    x = torch.randn(n, 1 * SIDE * SIDE, generator=g, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    xt = torch.randn(n, 1 * SIDE * SIDE, generator=g, dtype=torch.float64)
    train, test = ClientSplit.from_flat(x, y, sizes, 4), ClientSplit.from_flat(xt, y.clone(), sizes, 4)
    return FederatedData("matrix", train, test,
                         CLASSES, num_holdout=1 if unseen else 0)


def run_cell(algo_name: str, norm: str, optim: str, unit: str, unseen: bool, engine_cls):
    """(state, last evaluation row) of one cell, or raises ConfigError (its refusal)."""
    options = declared_options(algo_name)
    if OPTIMS[optim].weight_decay:  # a method's own L2 term (the debiasing methods', GPFL's mu) off: optim's
        own = signature_options(algorithm_class(algo_name))  # weight decay takes its place (both: refused)
        options.update({k: 0.0 for k in ("weight_decay",) if k in own})
        if algo_name == "gpfl":
            options["mu"] = 0.0
    if unit == "epochs":
        options["local_epochs"] = 1
    algo = build(algo_name, **options)
    algo = algo.bind(replace(algo.run, optim=OPTIMS[optim]))
    torch.manual_seed(0)
    model = ResNet10(SIDE * SIDE, CLASSES, norm=norm, width=2, in_channels=1, image_size=SIDE).double()
    params = params_of(model)
    algo.check_params(params)
    data = problem(unseen)
    sched = Schedule(rounds=1, tau=2, clients_per_round=len(TRAIN_SIZES), batch_size=B)
    algo.check_tau(sched.tau)
    state, last = simulate(algo, engine_cls(model), data, params, sched, 0)
    return state, last.row


def _refusal(algo_name: str, cell: tuple) -> str | None:
    for value in cell[1:]:
        words = REFUSED.get((algo_name, str(value)))
        if words:
            return words
    return None


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "-".join(map(str, c)))
def test_cell_runs_alike_in_both_engines_or_is_refused_in_one_line(cell):
    algo_name = cell[0]
    expected = _refusal(algo_name, cell)
    try:
        state_v, row_v = run_cell(*cell, VmapEngine)
    except ConfigError as e:
        assert "\n" not in str(e), "a refusal is one line"
        assert expected is not None, f"refused, but not pinned in REFUSED: {e}"
        assert expected in str(e)
        return
    assert expected is None, f"pinned as refused ({expected!r}) but it ran"
    state_l, row_l = run_cell(*cell, LoopEngine)
    for k, v in state_v.params.items():
        torch.testing.assert_close(v, state_l.params[k], **TOL, msg=f"{cell}: server entry {k}")
    for k, v in row_v.items():
        if isinstance(v, float):
            assert v == pytest.approx(row_l[k], rel=1e-9, abs=1e-10), f"{cell}: metric {k}"
    # the round trained: the server model moved (every method's server model follows its clients' steps,
    # except a purely local method's, whose served models moved instead)
    assert all(torch.isfinite(v.double()).all() for v in state_v.params.values() if v.is_floating_point())


def test_every_algorithm_class_is_in_the_matrix():
    assert {c[0] for c in CELLS} == set(ALGOS)
    assert all(algorithm_class(a) is not None for a in ALGOS)
