"""fedrun `protocol=official` against golden traces of PFLlib's representation methods (MOON, FedRoD,
FedProto, FedDBE), recorded by scripts/golden/record_pfllib_feat.py from PFLlib's own client classes and
server methods on the problem of tests/test_golden_pfllib.py, whose replay (the same initial
weights, clients and minibatches fed to fedrun's round loop) this reuses.

Compared after every round, |fedrun - PFLlib| <= ATOL + RTOL |PFLlib| (float32): the server model
(MOON, FedRoD) and each method's per-client state: MOON's previous models (`clients.prev`), FedRoD's
personal heads (`clients.head`), FedProto's client models (`clients.params`) and global prototypes
(`extra.protos`, and which classes have one), FedDBE's representation biases (`clients.dbe.bias`) and
global mean (`extra.global_mean`, from the round its server's constructor runs, fed the trace's
minibatches)."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import test_golden_pfllib as G
import torch

import fedrun.algorithms.feddbe
from fedrun.algorithms.base import client_entries

# algo -> fedrun options saying what the recorder's PFLlib arguments said (added to the replay's table)
G.OPTIONS.update({
    "moon": lambda a: ["algo.lr=0.1", f"algo.mu={a['mu']}", f"algo.temperature={a['tau']}"],
    "fedrod": lambda a: ["algo.lr=0.1"],
    "fedproto": lambda a: ["algo.lr=0.1", f"algo.lam={a['lamda']}"],  # (follow=pfllib: protocol=official's)
    "feddbe": lambda a: ["algo.lr=0.1", f"algo.momentum={a['momentum']}", f"algo.kappa={a['kl_weight']}"],
})
# trace key -> fedrun's clients[...] entry
PER_CLIENT = {"moon": ("prev", "prev"), "fedrod": ("heads", "head"), "fedproto": ("clients", "params"),
              "feddbe": ("bias", "dbe")}


def compare(trace: dict, states: list) -> dict[str, float]:
    """name -> worst |d| - ATOL - RTOL |ref| over every compared entry (> 0: a mismatch);
    `compare.max_abs` gets the largest |d| seen (scripts/golden/largest_differences.py prints it)."""
    worst: dict[str, float] = {}
    compare.max_abs = 0.0

    def close(key, ref, val):
        ref, val = np.asarray(ref, dtype=np.float64), val.detach().double().numpy()
        assert ref.shape == val.shape, key
        compare.max_abs = max(compare.max_abs, float(np.abs(ref - val).max(initial=0)))
        worst[key] = max(worst.get(key, -np.inf), float((np.abs(ref - val) - G.ATOL - G.RTOL * np.abs(ref)).max()))

    algo = trace["algorithm"]
    assert len(states) == len(trace["iterations"])
    for it, state in zip(trace["iterations"], states):
        for name, v in it.get("server", {}).items():
            close("server", v, state.params[G.NAMES[name]])
        src, mine = PER_CLIENT[algo]
        if algo == "feddbe":  # every client's representation bias, and the global mean fixed before round 1
            close("bias", [it["bias"][str(c)] for c in range(len(it["bias"]))], state.clients["dbe"]["bias"])
            close("global_mean", trace["init_period"]["global_mean"], state.extra["global_mean"])
            continue
        for c, models in it[src].items():
            for name, v in models.items():
                close(mine, v, client_entries(state.clients)[mine][G.NAMES[name]][int(c)])
        if "protos" in it:  # FedProto's global prototypes, and which classes have one
            present = state.extra["present"].tolist()
            assert present == [str(k) in it["protos"] for k in range(len(present))]
            for k, v in it["protos"].items():
                close("protos", v, state.extra["protos"][int(k)])
    return worst


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    """test_golden_pfllib's replay; FedDBE's round before round 1 fed the trace's minibatches too."""
    if "init_period" not in trace:
        return G.replay(trace, extra, engine)
    rows = trace["init_period"]["batches"]

    def init_rows(ctx, clients, steps):
        return torch.tensor([rows[str(c)] for c in clients.tolist()]) + ctx.data.train.offsets[clients].view(-1, 1, 1)

    with mock.patch.object(fedrun.algorithms.feddbe, "init_rows", init_rows):
        return G.replay(trace, extra, engine)


ALGOS = ["moon", "fedrod", "fedproto", "feddbe"]


@pytest.mark.parametrize("algo", ALGOS)
def test_official_protocol_replays_pfllib(algo):
    trace = G.load(algo)
    worst = compare(trace, replay(trace))
    assert set(worst) == {"moon": {"server", "prev"}, "fedrod": {"server", "head"}, "fedproto": {"params", "protos"},
                          "feddbe": {"server", "bias", "global_mean"}}[algo]
    assert all(v <= 0 for v in worst.values()), worst


def test_fedproto_the_papers_weights_are_not_pfllibs():
    """follow=paper (protocol=honest's) weights each client's prototype by its rows: the trace's global
    prototypes (PFLlib's unweighted mean) are not replayed, the clients' first-round models still are."""
    trace = G.load("fedproto")
    worst = compare(trace, G.replay(trace, ["algo.follow=paper"]))
    assert worst["protos"] > 0
