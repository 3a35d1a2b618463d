"""fedrun `protocol=official` against golden traces of PFLlib's model-mixing methods (FedAMP, FedPHP),
recorded by scripts/golden/record_pfllib_mix.py from PFLlib's own client and server classes on the
problem of tests/test_golden_pfllib.py, whose replay (the same clients and minibatches fed to
`fedrun.simulate`) this reuses. Checked after every round, within its tolerances (float32, RTOL, ATOL):
FedAMP every client's model and its cloud model u_i (the attention-weighted mixture the server sent);
FedPHP the server model, every client's model and its historical model.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

import test_golden_pfllib as base
from test_golden_pfllib import ATOL, RTOL, load

OPTIONS = {
    "fedamp": lambda a: ["algo.lr=0.1", f"algo.lam={a['lamda']}", f"algo.alpha_k={a['alphaK']}", f"algo.sigma={a['sigma']}"],
    "fedphp": lambda a: ["algo.lr=0.1", f"algo.mu={a['mu']}", f"algo.lam={a['lamda']}", f"algo.mu_rounds={a['global_rounds']}"],
}
# trace field -> where fedrun keeps it ("server": state.params, else state.clients[name])
FIELDS = {
    "fedamp": {"clients": "params", "cloud": "u"},
    "fedphp": {"server": "server", "clients": "params", "historical": "historical"},
}
# fields compared for the round's selected clients only: PFLlib's FedPHP sends the global model into
# EVERY client's `model` at the round's start, fedrun keeps each client's last personalized model
SELECTED_ONLY = {("fedphp", "clients")}


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    with mock.patch.dict(base.OPTIONS, OPTIONS):
        return base.replay(trace, extra, engine)


def compare(trace: dict, states: list) -> dict[str, float]:
    """field -> worst |d| - ATOL - RTOL |ref| over its entries in every round (> 0: a mismatch)."""
    worst: dict[str, float] = {}
    assert len(states) == len(trace["iterations"])
    for it, state in zip(trace["iterations"], states):
        for field, mine in FIELDS[trace["algorithm"]].items():
            rows = {None: it[field]} if field == "server" else it[field]
            for c, models in rows.items():
                if (trace["algorithm"], field) in SELECTED_ONLY and int(c) not in it["selected"]:
                    continue
                for name, ref in models.items():
                    key = base.NAMES[name]
                    val = state.params[key] if c is None else state.clients[mine][key][int(c)]
                    ref = np.asarray(ref, dtype=np.float64)
                    d = np.abs(ref - val.detach().double().numpy())
                    worst[field] = max(worst.get(field, -np.inf), float((d - ATOL - RTOL * np.abs(ref)).max()))
    return worst


@pytest.mark.parametrize("algo", list(OPTIONS))
def test_official_protocol_replays_pfllib_mixing(algo):
    trace = load(algo)
    worst = compare(trace, replay(trace))
    assert set(worst) == set(FIELDS[algo]) and all(v <= 0 for v in worst.values()), worst


def test_fedamp_loop_engine_and_the_paper_rule():
    """The loop engine replays FedAMP's trace too; follow=paper (its proximal gradient toward u_i,
    which PFLlib's detached regularizer lacks) moves the clients' models off it."""
    trace = load("fedamp")
    assert all(v <= 0 for v in compare(trace, replay(trace, engine="loop")).values())
    worst = compare(trace, replay(trace, ["algo.follow=paper"]))
    assert worst["clients"] > 0
