"""fedrun `protocol=official` against golden traces of the authors' pFedMe code (CharlieDinh/pFedMe).

The fixtures in tests/fixtures/golden/pfedme_*.json were recorded by running the authors' FedAvg,
Per-FedAvg and pFedMe (scripts/golden/record_pfedme.py has how, what and every run-time patch). Each
test rebuilds the run in fedrun from a Hydra-composed config (the authors' arguments mapped to
fedrun options below), feeds it the same initial weights, the same sampled clients and the same
minibatches (their loaders' row indices, injected by replacing `fedrun.simulate.sample_round` and
`fedrun.simulate.eval_context` for the test), and checks every recorded number:

  server model after every round      all entries (and sum, norm, first entries where evaluated)
                                      |fedrun - authors| <= ATOL + RTOL * |authors|
  personalized models per client      sum, norm, first entries, same tolerance
  accuracies                          per-client numbers of correct test rows, exactly
  training losses (pooled)            same tolerance

Rounds: the authors' loop evaluates at the START of its round i (global model w_i; Per-FedAvg's
adapted models from w_i) and pFedMe's personalized models after local training of round i, before
aggregation; fedrun evaluates after round r's server update. So fedrun's round r global (and
Per-FedAvg personalized) evaluation is the authors' iteration r, its pFedMe personalized evaluation
the authors' iteration r - 1, and its model after round r the authors' aggregate of iteration r - 1.
"""
from __future__ import annotations

import json
import os
from contextlib import ExitStack
from unittest import mock

import helpers
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import fedrun.simulate
from fedrun.algorithms.base import EvalContext
from fedrun.config import CONF_DIR
from fedrun.data.federated import ClientSplit, FederatedData
from fedrun.engine import ENGINES
from fedrun.evaluate import evaluate
from fedrun.run.protocol import apply_protocol
from fedrun.run.spec import schedule, validate

FIXTURES = os.path.join(helpers.FIXTURES, "golden")
RUNS = [(a, m) for a in ("fedavg", "peravg", "pfedme") for m in ("mclr", "dnn")]
# float32 tolerance, |fedrun - authors| <= ATOL + RTOL |authors| per model entry, derived from how an entry is
# computed (helpers.rounding_bound; as test_golden_pfllib.model_tol), not the tightest round numbers this
# machine's differences met (1e-6 and 2e-7; largest |diff| here: 3.8e-7, pFedMe MLR, vmap engine,
# scripts/golden/largest_differences.py). An entry ends a chain of at most STEPS SGD steps (pFedMe: 3 rounds of
# 3 local iterations of K = 3 inner steps and one outer step) and ROUNDS aggregations of JOIN clients (then
# pFedMe's beta mixing: + 3); a step rounds twice on |theta| and GRAD_OPS times on numbers of the size of its
# change, which STEP bounds (the largest change of any entry in one round of these traces: 0.108, FedAvg MLR).
# A sum or norm of n entries (the personalized models' summaries) gets n times the entries' tolerance.
# Accuracies must match exactly (smallest top-2 logit margin of any evaluated row: 8e-5, far above these
# differences).
STEPS, ROUNDS, JOIN = 3 * 3 * (3 + 1), 3, 2
GRAD_OPS, STEP = (13 + 9 + 7) + (4 + 1 + 4 + 1), 0.11  # the 12-8-4 DNN's (MLR's chain is shorter)
RTOL = helpers.rounding_bound(torch.float32, 1.0, 2 * STEPS + ROUNDS * (JOIN + 1 + 3))  # 1.1e-5
ATOL = helpers.rounding_bound(torch.float32, STEP, STEPS * GRAD_OPS)  # 1.8e-5

# The authors' layer names -> fedrun's (Mclr_Logistic.fc1 = MLR.linear; DNN fc1/fc2 = MLP net.0/net.2).
NAMES = {"mclr": {"fc1": "linear"}, "dnn": {"fc1": "net.0", "fc2": "net.2"}}


def fedrun_name(model: str, name: str) -> str:
    layer, kind = name.rsplit(".", 1)
    return f"{NAMES[model][layer]}.{kind}"


def overrides(trace: dict) -> list[str]:
    """The fedrun options that say what the authors' main.py arguments said."""
    a = trace["args"]
    common = ["protocol=official", f"rounds={a['num_global_iters']}", f"tau={a['local_epochs']}",
              f"batch_size={a['batch_size']}", f"clients_per_round={a['numusers']}", "frac=null", "device=cpu",
              "progress=false", "plot=false"]
    model = ["model=mlr"] if trace["model"] == "mclr" else ["model=dnn", f"model.hidden=[{trace['hidden']}]",
                                                             "model.activation=relu"]
    algo = {
        "FedAvg": ["algo=fedavg", f"algo.beta={a['learning_rate']}"],
        "PerAvg": ["algo=perfedavg", "algo.variant=fo", f"algo.alpha={a['learning_rate']}", f"algo.beta={a['beta']}"],
        "pFedMe": ["algo=pfedme", f"algo.eta={a['learning_rate']}", f"algo.lam={a['lamda']}", f"algo.K={a['K']}",
                   f"algo.personal_lr={a['personal_learning_rate']}", f"algo.beta={a['beta']}"],
    }[trace["algorithm"]]
    return common + model + algo


def load(name: str) -> dict:
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def golden_data() -> FederatedData:
    d = load("pfedme_data.json")
    splits = {s: ClientSplit.from_parts([(np.asarray(c[s]["x"], dtype=np.float32), np.asarray(c[s]["y"]))
                                         for c in d["clients"]]) for s in ("train", "test")}
    return FederatedData("golden_pfedme", splits["train"], splits["test"], d["num_classes"])


class RecordedTestBatches(EvalContext):
    """The minibatches the authors' evaluate_one_step drew in place of random ones: two test batches
    per client (their code since Nov 2020), or one test and one training batch (before)."""

    def __init__(self, base: EvalContext, iteration: dict):
        super().__init__(base.data, base.gen, base.batch_size, base.tau, base.personalize_batch)
        self.batches = {"test": iteration["test_batches"], "train": iteration.get("eval_train_batches")}

    def _recorded(self, split_name, size, steps):
        split, batches = getattr(self.data, split_name), self.batches[split_name]
        assert size == self.batch_size and all(len(batches[str(c)]) == (steps[0] if steps else 1)
                                               for c in range(split.num_clients))
        idx = torch.stack([torch.tensor(batches[str(c)]) for c in range(split.num_clients)])
        idx = (idx if steps else idx[:, 0]) + split.offsets.view(-1, *[1] * (idx.dim() - 1 if steps else 1))
        return split.x[idx], split.y[idx]

    def test_batch(self, size, steps=()):
        return self._recorded("test", size, steps)

    def train_batch(self, size=None, steps=()):
        if self.batches["train"] is None:  # the trace's test-time step drew none: fedrun's own draw
            return super().train_batch(size, steps)
        return self._recorded("train", size, steps)


def replay(trace: dict, extra: list[str] = ()) -> dict:
    """Runs fedrun on the trace's problem with its clients and minibatches; returns what it computed."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides(trace) + list(extra))
    apply_protocol(cfg)
    assert not validate(cfg)
    data = golden_data()
    algo = instantiate(cfg.algo)
    model = instantiate(cfg.model, in_features=data.in_features, num_classes=data.num_classes)
    engine = ENGINES[cfg.engine](model, max_chunks=cfg.max_chunks)
    sched = schedule(cfg, data.num_clients)
    params = {fedrun_name(trace["model"], k): torch.tensor(v, dtype=torch.float32) for k, v in trace["init"].items()}
    assert set(params) == {k for k, _ in model.named_parameters()}
    its = trace["iterations"]

    def sample_round(data, sched, k, seed, rnd, train_all=False):
        it = its[rnd - 1]
        clients = torch.tensor(it["selected"])
        trained = torch.arange(data.num_clients) if train_all else clients
        idx = []
        for c in trained.tolist():
            b = it["train_batches"][str(c)]
            assert len(b) == sched.tau * k
            idx.append([b[s * k:(s + 1) * k] for s in range(sched.tau)])
        idx = torch.tensor(idx) + data.train.offsets[trained].view(-1, 1, 1, 1)
        return clients, trained, idx

    def eval_context(data, sched, seed, rnd):
        return RecordedTestBatches(real_eval_context(data, sched, seed, rnd), its[rnd])

    served = []
    personalize = algo.personalize

    def spy(engine, state, ctx):
        out = personalize(engine, state, ctx)
        served.append(out[0])
        return out

    algo.personalize = spy
    real_eval_context = fedrun.simulate.eval_context
    states, evals = [], []
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(fedrun.simulate, "sample_round", sample_round))
        stack.enter_context(mock.patch.object(fedrun.simulate, "eval_context", eval_context))
        state0 = algo.init(params, data.num_clients)
        # the authors' round 0
        evals.append(evaluate(algo, engine, state0, data, eval_context(data, sched, cfg.seed, 0)))
        fedrun.simulate.simulate(algo, engine, data, params, sched, cfg.seed,
                                 on_eval=lambda rnd, _, ev: evals.append(ev),
                                 on_checkpoint=lambda at: states.append(at.state), checkpoint_every=1)
    n_train = data.train.sizes.double()

    def pooled_train_loss(p):
        loss, _ = engine.evaluate(p, data.train, shared=False)
        return float(loss.double().sum() / n_train.sum())

    return {
        "params": [s.params for s in states],
        "global_correct": [[round(float(v)) for v in ev.per_client["global_acc"] * data.test.sizes] for ev in evals],
        "global_acc": [ev.row["global_acc"] for ev in evals],
        "train_loss": [ev.row["train_loss"] for ev in evals],
        "pers_correct": [[round(float(v)) for v in ev.per_client["pers_acc"] * data.test.sizes]
                         if "pers_acc" in ev.per_client else None for ev in evals],
        "pers_acc": [ev.row.get("pers_acc") for ev in evals],
        "pers_train_loss": [pooled_train_loss(p) if p is not None else None for p in served],
        "pers_params": served,
        "init": params,
    }


def compare(trace: dict, got: dict) -> dict[str, float]:
    """What differs from the trace: name -> worst excess over the tolerance (|d| - ATOL - RTOL|ref|,
    > 0 is a mismatch; an accuracy mismatch counts its number of wrong clients). Every recorded
    number is compared; `compare.max_abs` gets the largest absolute difference seen."""
    its, algorithm = trace["iterations"], trace["algorithm"]
    worst: dict[str, float] = {}
    compare.max_abs = 0.0

    def close(key, ref, val, n=None):  # n: how many entries each number sums (1 each by default)
        ref, val = np.asarray(ref, dtype=np.float64), np.asarray(val, dtype=np.float64)
        assert ref.shape == val.shape, key
        d = np.abs(ref - val)
        compare.max_abs = max(compare.max_abs, float(d.max(initial=0)))
        excess = float((d - (1 if n is None else np.asarray(n)) * (ATOL + RTOL * np.abs(ref))).max(initial=-np.inf))
        worst[key] = max(worst.get(key, -np.inf), excess)

    def exact(key, ref, val):
        wrong = sum(a != b for a, b in zip(ref, val)) + abs(len(ref) - len(val))
        worst[key] = max(worst.get(key, -np.inf), float(wrong) if wrong else -1.0)

    def summary_close(key, ref_summary, p):
        for name, s in ref_summary.items():
            t = p[fedrun_name(trace["model"], name)].detach().double()
            close(key, [s["sum"], s["norm"], *s["head"]], [float(t.sum()), float(t.norm()), *t.flatten()[:3].tolist()],
                  [t.numel(), t.numel(), *[1] * len(s["head"])])

    R = len(its) - 1
    for r in range(1, R + 1):  # fedrun's model after round r = the authors' aggregate in iteration r - 1
        for name, v in its[r - 1]["aggregated"].items():
            close("params", v, got["params"][r - 1][fedrun_name(trace["model"], name)])
    for r in range(R + 1):  # global evaluations: fedrun round r = the authors' iteration r (0: initial model)
        g = its[r].get("global")
        if g is not None:
            summary_close("params", g["params"], got["params"][r - 1] if r else got["init"])
            exact("global_acc", g["correct"], got["global_correct"][r])
            close("global_acc", g["acc"], got["global_acc"][r])
            close("train_loss", g["train_loss"], got["train_loss"][r])
    for r in range(R + 1):
        src = r if algorithm == "PerAvg" else r - 1  # pFedMe's personalized evaluation follows training
        if src < 0 or "pers" not in its[src]:
            continue
        p = its[src]["pers"]
        exact("pers_acc", p["correct"], got["pers_correct"][r] or [])
        close("pers_acc", p["acc"], got["pers_acc"][r])
        close("pers_train_loss", p["train_loss"], got["pers_train_loss"][r])
        for c, ref in enumerate(p["clients"]):
            summary_close("pers_params", ref, {k: v[c] for k, v in got["pers_params"][r].items()})
    return worst


def mismatched(worst: dict[str, float]) -> set[str]:
    return {k for k, v in worst.items() if v > 0}


@pytest.mark.parametrize("algorithm,model", RUNS)
def test_official_protocol_replays_the_authors_code(algorithm, model):
    trace = load(f"pfedme_{algorithm}_{model}.json")
    worst = compare(trace, replay(trace))
    assert not mismatched(worst), worst
    expected = {"params", "global_acc", "train_loss"} if algorithm != "peravg" else {"params", "pers_acc",
                                                                                      "pers_train_loss", "pers_params"}
    if algorithm == "pfedme":
        expected |= {"pers_acc", "pers_train_loss", "pers_params"}
    assert expected <= set(worst)  # every kind of recorded number was compared


def test_fedavg_honest_differs_only_by_the_aggregation_weights():
    trace = load("pfedme_fedavg_dnn.json")
    assert mismatched(compare(trace, replay(trace, ["protocol=honest"]))) >= {"params"}
    assert not mismatched(compare(trace, replay(trace, ["protocol=honest", "aggregate=samples"])))


def test_perfedavg_honest_differs_by_aggregation_and_test_time_personalization():
    trace = load("pfedme_peravg_dnn.json")
    honest = mismatched(compare(trace, replay(trace, ["protocol=honest"])))
    assert {"params", "pers_acc", "pers_params"} <= honest
    # uniform averaging was what moved the server model; test_time=train (one step on the client's
    # training rows) is what moves the personalized models
    weighted = mismatched(compare(trace, replay(trace, ["protocol=honest", "aggregate=samples"])))
    assert "params" not in weighted and {"pers_params", "pers_train_loss"} <= weighted
    assert not mismatched(compare(trace, replay(trace, ["protocol=honest", "aggregate=samples",
                                                        "algo.test_time=test_batches"])))


# pFedMe: each option of protocol=official set alone to its honest value, and what that changes.
PFEDME_OPTIONS = {
    "aggregate=uniform": {"params", "global_acc"},
    "algo.mu=0.0": {"params", "pers_params"},
    "algo.personalized=theta": {"pers_params"},
    "algo.train_all=false": {"pers_params"},  # PM recomputed at test time from w on fresh training batches
}


@pytest.mark.parametrize("option", sorted(PFEDME_OPTIONS))
def test_pfedme_each_official_option_is_needed(option):
    trace = load("pfedme_pfedme_dnn.json")
    diff = mismatched(compare(trace, replay(trace, [option])))
    assert PFEDME_OPTIONS[option] <= diff, diff
    if option in ("algo.personalized=theta", "algo.train_all=false"):
        assert "params" not in diff  # only what is served as PM changes, not the training


def test_pfedme_honest_with_the_official_choices_set_one_by_one_matches():
    trace = load("pfedme_pfedme_dnn.json")
    assert {"params", "pers_params"} <= mismatched(compare(trace, replay(trace, ["protocol=honest"])))
    choices = ["aggregate=samples", "algo.mu=0.001", "algo.personalized=local", "algo.train_all=true"]
    assert not mismatched(compare(trace, replay(trace, ["protocol=honest", *choices])))


@pytest.mark.parametrize("algorithm", ["peravg", "pfedme"])
def test_loop_engine_replays_the_authors_code_too(algorithm):
    trace = load(f"pfedme_{algorithm}_dnn.json")
    assert not mismatched(compare(trace, replay(trace, ["engine=loop"])))


# The authors' Per-FedAvg as of June 2020 (commit c0722e7, the code behind the pFedMe paper's numbers;
# scripts/golden/record_pfedme.py --authors <that checkout> --algorithms PerAvg --suffix _2020).
@pytest.mark.parametrize("model", ("mclr", "dnn"))
@pytest.mark.parametrize("options", (["protocol=official_2020"],
                                     ["algo.outer_step_from=w_tilde", "algo.test_time=test_then_train"]))
def test_the_2020_perfedavg_code_replays_with_its_two_options(model, options):
    trace = load(f"pfedme_peravg_{model}_2020.json")
    assert trace["authors"]["commit"].startswith("c0722e7")
    worst = compare(trace, replay(trace, options))
    assert not mismatched(worst), worst
    assert {"params", "pers_acc", "pers_train_loss", "pers_params"} <= set(worst)


def test_each_of_the_2020_perfedavg_options_is_needed():
    trace = load("pfedme_peravg_dnn_2020.json")
    # the outer step from w (the paper's algorithm, their code since March 2021) moves the server model
    assert "params" in mismatched(compare(trace, replay(trace, ["algo.test_time=test_then_train"])))
    # the right training but another test-time step moves only the personalized models
    other = mismatched(compare(trace, replay(trace, ["algo.outer_step_from=w_tilde", "algo.test_time=train"])))
    assert "params" not in other and {"pers_params", "pers_acc"} & other
    # and today's code's trace is not replayed by the 2020 options
    assert "params" in mismatched(compare(load("pfedme_peravg_dnn.json"),
                                          replay(load("pfedme_peravg_dnn.json"), ["algo.outer_step_from=w_tilde"])))
