"""FedAvg, Ditto and FedRep with a BatchNorm model under `bn=local` against golden traces of PFLlib's own
classes (clientavg / clientditto / clientrep with their servers' send_models, receive_models,
aggregate_parameters; TsingZ0/PFLlib d832e76).

scripts/golden/record_pfllib.py (`fedavg_bn`, `ditto_bn`, `fedrep_bn`) ran them with FedBN's model (fc1 12-8,
bn1 BatchNorm1d(8), ReLU, fc2 8-4; FedRep's as PFLlib's BaseHeadSplit, base = fc1, bn1, ReLU) on the
traced problem of tests/test_golden_pfllib.py, in float64, and recorded per round the selected
clients, their minibatches, the order receive_models took their models (`uploaded`), the server's
model and every client's model with its running statistics (Ditto: its personal model too).

What PFLlib computes (clientbase.py:67-69 set_parameters and serverbase.py:148-150 add_parameters walk
`model.parameters()`; serverbase.py:141 copies the first uploaded model): each client's BatchNorm
statistics stay in its own model across rounds, never sent; the server's model carries a copy of the
first uploaded client's. fedrun's `bn=local` is that: each client's statistics of the shared model kept
in `ServerState.trainer["bn_local"]`, the server's model carrying its first aggregated client's. PFLlib's
first is random.sample's (in the trace, the second selected client in rounds 1 and 3), fedrun's is its
lowest-numbered sampled client; the test pins both: PFLlib's server statistics equal its first uploaded
client's (from the trace itself), fedrun's equal PFLlib's statistics of fedrun's first client.

Compared, |fedrun - PFLlib| <= ATOL + RTOL |PFLlib| with test_golden_pfllib's TOL64 (derived there for FedBN's
float64 trace: up to 20 steps with BatchNorm's 2 x 14 operations, entries changing by up to 0.9 a round;
these traces' largest change in a round: 0.87 (running statistics) and 0.20 (Ditto's parameters)):
the server's parameters, its statistics, every client's statistics of the shared model, Ditto's personal
models (parameters and statistics), FedRep's heads. Both engines.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from test_golden_pfedme import golden_data
from test_golden_pfllib import BN_NAMES, OPTIONS, TOL64, load, official_cfg, replay_rounds, trace_sampler

from fedrun.engine import ENGINES

ALGOS = ["fedavg", "ditto", "fedrep"]
BN_OPTIONS = {"fedavg": lambda a: ["algo.lr=0.1", "algo.alpha=null"], "ditto": OPTIONS["ditto"],
              "fedrep": OPTIONS["fedrep"]}


def is_buffer(name: str) -> bool:
    return "running_" in name or name.endswith("num_batches_tracked")


def kind(name: str) -> str:
    """A buffer's kind: its layer's batch count (an integer), or a running statistic."""
    return "counts" if name.endswith("num_batches_tracked") else "statistics"


def fedrun_name(name: str) -> str:
    """fedrun's name (model=mlp_bn, hidden=[8]: net.0 Linear, net.1 BatchNorm1d, net.2 ReLU, net.3 Linear)
    of an entry of PFLlib's model: FedBN's names, or FedRep's BaseHeadSplit (base.0, base.1, head; its
    server holds the base: 0, 1)."""
    name = name.removeprefix("base.")
    if name.startswith("head."):
        return "net.3." + name.removeprefix("head.")
    return f"net.{name}" if name[0] in "01" else BN_NAMES[name]


def replay(trace: dict, engine: str = "vmap", bn: str = "local") -> tuple[list, object]:
    """fedrun (float64) on the trace's problem with its clients and minibatches under `bn`: the state after
    every round, and the algorithm."""
    a, algo, phases = trace["args"], trace["algorithm"], trace["phases"]
    tau = sum(n for _, n in phases) if algo == "fedrep" else phases[0][1]
    cfg = official_cfg(algo, BN_OPTIONS[algo](a), a, tau, engine, [f"bn={bn}"], "mlp_bn")
    data = golden_data()
    data.train.x, data.test.x = data.train.x.double(), data.test.x.double()  # the rows as the recorder widened them
    algorithm = instantiate(cfg.algo)
    algorithm = algorithm.bind(replace(algorithm.run, bn=cfg.bn))
    model = instantiate(cfg.model, in_features=data.in_features, num_classes=data.num_classes).double()
    params = {fedrun_name(k): torch.tensor(v, dtype=torch.long if k.endswith("num_batches_tracked") else torch.float64)
              for k, v in trace["init"].items()}
    its = trace["iterations"]

    states = replay_rounds(cfg, algorithm, ENGINES[cfg.engine](model), data, params,
                           sample_round=trace_sampler(its, algo, phases))
    return states, algorithm


def compare(trace: dict, states: list, algorithm) -> dict[str, float]:
    """name -> worst |d| - ATOL - RTOL |ref| over every compared entry of that kind (> 0: a mismatch);
    `compare.max_abs` gets the largest |d| seen."""
    algo, (rtol, atol), worst = trace["algorithm"], TOL64, {}
    compare.max_abs = 0.0
    in_client = (lambda n: "base." + n) if algo == "fedrep" else (lambda n: n)  # a server entry's client name

    def close(key, ref, val):
        ref, val = np.asarray(ref, dtype=np.float64), val.detach().double().numpy()
        assert ref.shape == val.shape, key
        d = np.abs(ref - val)
        compare.max_abs = max(compare.max_abs, float(d.max(initial=0)))
        worst[key] = max(worst.get(key, -np.inf), float((d - atol - rtol * np.abs(ref)).max()))

    assert len(states) == len(trace["iterations"])
    for it, state in zip(trace["iterations"], states):
        server, first = algorithm.eval_params(state), str(min(it["selected"]))
        for name, v in it["server"].items():
            if is_buffer(name):  # PFLlib's: its first uploaded client's; fedrun's: its first client's
                assert v == it["clients"][str(it["uploaded"][0])][in_client(name)], name
                close(f"server {kind(name)}", it["clients"][first][in_client(name)], server[fedrun_name(name)])
            else:
                close("server", v, server[fedrun_name(name)])
        for c, model in it["clients"].items():
            for name, v in model.items():
                if is_buffer(name) and "bn_local" in state.trainer:
                    close(f"client {kind(name)}", v, state.trainer["bn_local"][fedrun_name(name)][int(c)])
                if name.startswith("head."):
                    close("head", v, state.clients.part[fedrun_name(name)][int(c)])
        for c, model in it.get("personal", {}).items():
            for name, v in model.items():
                close("personal", v, state.clients.personal[fedrun_name(name)][int(c)])
    return worst


KINDS = {"server", "server statistics", "server counts", "client statistics", "client counts"}


@pytest.mark.parametrize("engine", ["vmap", "loop"])
@pytest.mark.parametrize("algo", ALGOS)
def test_bn_local_replays_pfllib(algo, engine):
    trace = load(f"{algo}_bn")
    worst = compare(trace, *replay(trace, engine))
    assert set(worst) == KINDS | {"ditto": {"personal"}, "fedrep": {"head"}}.get(algo, set())
    assert all(v <= 0 for v in worst.values()), worst


@pytest.mark.parametrize("algo", ALGOS)
def test_bn_averaged_is_not_pfllibs(algo):
    """Under bn=averaged the parameters still replay PFLlib's (training runs on batch statistics), the
    server's statistics do not: the trace pins the policy."""
    trace = load(f"{algo}_bn")
    worst = compare(trace, *replay(trace, bn="averaged"))
    assert "client statistics" not in worst  # (no per-client statistics of the shared model kept)
    assert worst["server"] <= 0 and worst["server statistics"] > 1e-2, worst  # (the tolerance: 2.7e-13)
