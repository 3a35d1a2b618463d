"""fedrun `protocol=official` (algo.follow=pfllib) against a golden trace of PFLlib's FedFomo (clientFomo,
serverFomo), recorded by scripts/golden/record_pfllib_fomo.py on the problem of
tests/test_golden_pfllib.py: the same clients, validation and training minibatches fed to
`fedrun.simulate`. Checked after every round, within its tolerances (float32, RTOL, ATOL): every
client's model, its model after the round's mixture (PFLlib's old_model) and the affinity matrix P.
"""
from __future__ import annotations

import torch

import fedrun.simulate
from fedrun.engine import ENGINES
from test_golden_pfllib import NAMES, Worst, load, official_cfg, replay_rounds, replay_setup


def replay(trace: dict, extra: list[str] = (), engine: str = "vmap") -> list:
    """fedrun's FedFomo fed the trace's clients, validation minibatches (its first phase, one step of
    val_batches minibatches) and training minibatches (its second); the state after every round."""
    a, its = trace["args"], trace["iterations"]
    cfg = official_cfg("fedfomo", [f"algo.lr={a['lr']}", f"algo.M={a['M']}", f"algo.val_batches={a['val_batches']}"],
                       a, trace["phases"][1][1], engine, extra)
    data, algorithm, model, params = replay_setup(trace, cfg)

    def sample_phases(data, sched, phases, seed, rnd, train_all=False):
        it = its[rnd - 1]
        clients = torch.tensor(it["selected"])
        off = data.train.offsets[clients].view(-1, 1, 1, 1)
        val = torch.tensor([[it["batches"][str(c)]["val"]] for c in it["selected"]]) + off  # [m, 1, V, B]
        train = torch.tensor([[[b] for b in it["batches"][str(c)]["train"]] for c in it["selected"]]) + off  # [m, tau, 1, B]
        assert val.shape[1:3] == (phases[0].steps, phases[0].batches) and train.shape[1] == phases[1].steps
        return clients, clients, (fedrun.simulate.PhaseDraw(val, None), fedrun.simulate.PhaseDraw(train, None))

    return replay_rounds(cfg, algorithm, ENGINES[cfg.engine](model), data, params, sample_phases=sample_phases)


def compare(trace: dict, states: list) -> Worst:
    """field -> worst |d| - ATOL - RTOL |ref| over its entries in every round (> 0: a mismatch)."""
    worst = Worst()
    worse = worst.close
    assert len(states) == len(trace["iterations"])
    for it, state in zip(trace["iterations"], states):
        for field, mine in (("clients", "params"), ("old", "old")):
            for c, models in it[field].items():
                for name, ref in models.items():
                    worse(field, ref, state.clients[mine][NAMES[name]][int(c)])
        worse("affinity", it["affinity"], state.clients["affinity"]["P"])
    return worst


def test_official_protocol_replays_pfllib_fedfomo_and_the_paper_rule_differs():
    """Both engines replay PFLlib's trace (its neighbours, weights, P); follow=paper (w_n measured from
    the client's current model, not from its model before its last training) moves P off it."""
    trace = load("fedfomo")
    assert any(it["received"][c] for it in trace["iterations"] for c in it["received"])  # neighbours were weighed
    for engine in ("vmap", "loop"):
        worst = compare(trace, replay(trace, engine=engine))
        assert set(worst) == {"clients", "old", "affinity"} and all(v <= 0 for v in worst.values()), (engine, worst)
    assert compare(trace, replay(trace, ["algo.follow=paper"]))["affinity"] > 0
