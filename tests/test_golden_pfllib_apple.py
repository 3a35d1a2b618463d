"""fedrun `protocol=official` (algo.follow=pfllib) against a golden trace of PFLlib's APPLE
(clientAPPLE, serverAPPLE's send_models), recorded by scripts/golden/record_pfllib_apple.py on the
problem of tests/test_golden_pfllib.py, whose replay this reuses: every client's core model, its
personalized model and its relationship vector p_i after each of 3 rounds (every client trains every
round), within its tolerances (RTOL, ATOL); the proximal weight decays 1, 1, 0.75 over them."""
from __future__ import annotations

from unittest import mock

import numpy as np
import test_golden_pfllib as base
import test_golden_pfllib_mix as mix
from test_golden_pfllib import ATOL, RTOL, load

OPTIONS = {"apple": lambda a: ["algo.lr=0.1", f"algo.dr_lr={a['dr_learning_rate']}", f"algo.mu={a['mu']}",
                               f"algo.decay={a['L']}"]}
FIELDS = {"apple": {"core": "params", "clients": "theta"}}


def worst(trace: dict, states: list) -> dict[str, float]:
    """field -> worst |d| - ATOL - RTOL |ref| (> 0: a mismatch), the models' and p's."""
    with mock.patch.dict(mix.FIELDS, FIELDS):
        out = mix.compare(trace, states)
    for it, state in zip(trace["iterations"], states):
        ref = np.array([it["p"][str(c)] for c in range(len(it["p"]))])
        d = np.abs(ref - state.clients.p["p"].double().numpy())
        out["p"] = max(out.get("p", -np.inf), float((d - ATOL - RTOL * np.abs(ref)).max()))
    return out


def test_official_protocol_replays_pfllib_apple():
    """Both engines replay the trace; follow=paper (the trained core uploaded, not theta_i) leaves it."""
    trace = load("apple")
    with mock.patch.dict(base.OPTIONS, OPTIONS):
        for engine in ("vmap", "loop"):
            w = worst(trace, base.replay(trace, engine=engine))
            assert set(w) == {"core", "clients", "p"} and all(v <= 0 for v in w.values()), (engine, w)
        assert worst(trace, base.replay(trace, ["algo.follow=paper"]))["core"] > 0
