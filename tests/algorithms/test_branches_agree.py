"""Every device branch of the vmap engine (fedrun.branches.BRANCHES: the CNN's vmapped convolutions
that a GPU run takes, autograd instead of the hand-written backward, the GPU's full-pass groups, the
images' memory order) against the loop engine, on the CPU, for every model (MLR, MLP, CNN) and every
algorithm conf/algo knows (fedrun.bench.agreement). The cases are read from BRANCHES and conf/algo, so a
new branch or algorithm is checked without a new line here."""
from __future__ import annotations

import pytest
import torch

from fedrun import algorithms
from fedrun.bench import agreement
from fedrun.branches import BRANCHES, check_paths, choose, settings
from fedrun.engine import VmapEngine

CASES = [c for c in agreement.cases("cpu") if c.model not in agreement.SUITE_SKIPS]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_branch_agrees_with_the_loop_engine(case):
    res = agreement.run_case(case, "cpu", torch.float64)
    assert res["ok"], f"{case.id}: {res['worst']} off by {res['ratio']:.3g} tolerances (max |err| {res['max_err']:.3g})"


def test_the_cases_run_every_value_of_every_branch_on_every_model_it_applies_to():
    for model in set(agreement.MODELS) - agreement.SUITE_SKIPS:
        forced = {(k, v) for c in CASES if c.model == model for k, v in c.paths}
        probe = agreement.MODELS[model](agreement.data_of(model, torch.float64, "cpu"))
        for name, b in BRANCHES.items():
            if b.applies(probe):
                ran = {v for k, v in forced if k == name} | {choose(name, "cpu")}
                assert ran == set(b.values), (model, name)
    assert {c.model for c in CASES} == set(agreement.MODELS) - agreement.SUITE_SKIPS == {"mlr", "mlp", "cnn", "mlp_bn"}
    # every algorithm on the local trainer that handles BatchNorm (issue 44), but pflscaf, whose default
    # adaptation=maml refuses it (docs/baselines.md, "Which method takes which recipe")
    takes_bn = {a for a in algorithms.names() if algorithms.algorithm_class(a).batchnorm_ok} - {"pflscaf"}
    assert {c.algo for c in CASES if c.model == "mlp_bn"} == takes_bn and len(takes_bn) == 28
    # the CNN runs its vmapped (GPU) convolutions on the CPU here
    assert any(dict(c.paths).get("conv") == "vmap" for c in CASES if c.model == "cnn")
    # on cuda the CPU's paths become the forced ones
    assert {"conv": "per_client", "groups": "rows", "layout": "channels_last"} in [
        s for s in settings(agreement.MODELS["cnn"](agreement.data_of("cnn", torch.float64, "cpu")), "cuda")]


def test_an_unknown_path_is_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match="choose from: conv, backward, groups, layout, rnn"):
        check_paths({"convs": "vmap"})
    with pytest.raises(ValueError, match="conv='gpu' is not allowed; choose one of: per_client, vmap"):
        VmapEngine(torch.nn.Linear(2, 2), paths={"conv": "gpu"})
